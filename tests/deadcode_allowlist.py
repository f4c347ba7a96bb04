"""Names vulture cannot see used (scripts/deadcode.py reads this file beside the code): each one is used by
code outside the course (torch, SWIFT, IPython, JupyterHub, ...) that calls or reads it by its name."""


class _Any:
    """Stands for any object: vulture counts each attribute name read from it as used."""

    def __getattr__(self, name):
        return None


_ = _Any()

USED_OUTSIDE_THE_COURSE = [
    # helpers/
    _._fetch_infer_requests,  # answering.Chat.close: replaced on SWIFT's engine, whose worker thread calls it
    _.tb,  # errors._short_traceback: IPython's set_custom_exc calls it with (shell, etype, value, tb, tb_offset=)
    _.tb_offset,  # errors._short_traceback: IPython passes it by this keyword
    _._ipython_display_,  # exercises.Verdict: IPython's display protocol (a verdict already printed itself)
    _._repr_markdown_,  # profiles.Profile: Jupyter's rich display of a cell's last value
    _.pre_tokenizer,  # models._tiny_tokenizer: set on a tokenizers.Tokenizer, which reads it
    _.decoder,  # models._tiny_tokenizer: set on a tokenizers.Tokenizer, which reads it
    _.num_batches_tracked,  # parallelism: a BatchNorm buffer, counted as nn.BatchNorm1d counts it
    _.auto_config_cls,  # troubleshooting: set on SWIFT's DeepseekVLLoader, which its get_config reads
    _.local_repo_path,  # troubleshooting: set on SWIFT's DeepseekVLLoader, which its get_config reads
    _.__qualname__,  # set on a function that stands in for another: Python's reprs and tracebacks read it
    # course/
    _.CourseAuthenticator,  # hub: named in the jupyterhub_config.py that course.hub writes
    _.CourseSpawner,  # hub: named in the jupyterhub_config.py that course.hub writes
    _.authenticate,  # hub.CourseAuthenticator: JupyterHub's Authenticator calls it
    _.handler,  # hub.CourseAuthenticator.authenticate: JupyterHub's signature
    _.make_preexec_fn,  # hub.CourseSpawner: JupyterHub's LocalProcessSpawner calls it
    _.user_env,  # hub.CourseSpawner: JupyterHub's Spawner calls it
    _._transport_default,  # runner: a traitlets @default, found by its decorator
    _._ip_default,  # runner: a traitlets @default, found by its decorator
    _._transport_encryption_default,  # runner: a traitlets @default, found by its decorator
    _.signum,  # runner: a signal handler's signature
    _.frame,  # runner: a signal handler's signature
    _.current_device,  # pretend/sitecustomize: replaced on torch.cuda, which torch calls
    _.mem_get_info,  # pretend/sitecustomize: replaced on torch.cuda, which torch calls
    _._check_bf16_tensor_supported,  # pretend/sitecustomize: replaced on torch.cuda, which torch calls
    _.execution_count,  # student: a notebook cell's field, written out by nbformat
    _.header,  # translation: a catalog's field, written out by polib
    _.previous_msgid,  # translation: a catalog entry's field, written out by polib
    _.occurrences,  # translation: a catalog entry's field, written out by polib
]

USED_BY_MAKE_TEST = [
    _.ONE_GPU_PATHS,  # gpu_check: the notebooks make test's 1-process gpu shape runs (tests/test_gpu_shape.py)
]
