"""11's CPU pitfall, run every time: SWIFT's ZeRO-2 preset without --use_cpu on two CPU processes stops at
DeepSpeed's batch-size assertion. The lesson quotes that error and leaves the 40-second run to the learner
(SHOW_CPU_PITFALL = True); this test runs the lesson's own cells, so the quoted error stays the real one."""

import nbformat
import papermill as pm

from helpers import paths

NOTEBOOK = "11_beyond_ddp.ipynb"
CELLS = ("c02", "c03", "c33", "c35")  # parameters, set-up, the command builder, the pitfall
ERROR = "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 2 != 2 * 1 * 2"


def test_11s_zero2_preset_without_use_cpu_fails_on_deepspeeds_batch_assertion(tmp_path):
    nb = nbformat.read(paths.NOTEBOOKS / NOTEBOOK, as_version=4)
    lesson_text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert ERROR in " ".join(lesson_text.split()), "11 no longer quotes the error this test checks"
    nb.cells = [c for c in nb.cells if c.id in CELLS]
    assert [c.id for c in nb.cells] == list(CELLS)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    source = tmp_path / NOTEBOOK
    nbformat.write(nb, source)
    done = pm.execute_notebook(
        str(source), str(tmp_path / "out.ipynb"), cwd=str(paths.NOTEBOOKS), kernel_name="python3",
        progress_bar=False, parameters={"PROFILE": "smoke", "NPROC": 2, "SWIFT_STEPS": 2, "SHOW_CPU_PITFALL": True},
    )
    text = "\n".join(o.get("text", "") for c in done.cells if c.cell_type == "code" for o in c.outputs)
    assert "--deepspeed zero2" in text and "--use_cpu" not in text  # the command it printed, then ran
    assert ERROR in text  # c35 also asserts it, or the run above would have failed
    assert "Not run" not in text
