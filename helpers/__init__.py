"""The course's small library: what a lesson imports, one module per concept.

The course's small library, one module per concept: what a lesson imports (the course's own tooling is in
course/, ARCHITECTURE.md).

- paths      where the repository, build/ (run outputs) and build/outputs/ (what you train) are; writing there
             atomically, one process at a time, and building a folder once
- errors     CourseError: a one-sentence error for learners, shown without a traceback
- profiles   cpu / gpu / smoke / auto: resolve and validate a notebook's parameters; the gpu profile's dtype,
             and the ranks a lesson runs on one GPU
- models     make the course models available offline (SmolLM2, a tiny smoke model, ModelScope ids), and let
             every model go at a notebook's end
- disk       free space checked before a download or a large write, and what the gpu route needs
- swift_local_code_only  a SWIFT plugin (--external_plugins): no code shipped in a model folder runs
- launching  run torchrun and other commands from a cell: live rank-prefixed output, timeouts, results, on
             the GPUs this process may use
- swiftcli   the `swift` command as text a learner can type, run from a cell
- environment installed versions against the pins, accelerators and distributed backends
- report     record a notebook's key metrics (collected into the run report) and show tables
- plots      the course's plot style and a timeline of measured intervals
- toys       the one toy-model builder (an MLP); each lesson's model is a configuration of it
- bytecount  bytes held by tensors and modules, each storage once, and bytes as a reader says them
- compare    how far apart two results are (tensors, gradients, state dicts, models), and a model's fingerprint
- exercises  check(), its verdicts and on_ranks (a function run on real ranks); each notebook's checkers in
             exercises/nbNN.py

One module per lesson concept, each explained in its notebook:
- parallelism   01: shards, gradient averaging, parameter-server vs ring traffic, training-state bytes
- dataparallel  02: a threaded DataParallel that traces the nine steps of a step
- dp_costs      02: what DataParallel costs the main device, step times against K, torch's own DataParallel
- collective    03, 07: algbw / busbw from measured times, the alpha-beta model of a link
- bucketing     04, 05: how DDP's Reducer packs gradients into buckets, and the buckets a comm hook saw
- comm_hooks    04, 05, 06, 07: overlap read from timed steps, drawn and summarised
- netlab        06, 07: nodes as network namespaces on a rate-limited link, for torchrun across them
- training      06: toy data and model, the checks of a run's layout, all-reduce volume, scaling
- sampling      06: DistributedSampler's shards, with and without set_epoch
- checkpoints   06: atomic checkpoints, resumed bit for bit after a killed worker
- selfcog       09: the self-cognition data, its placeholders and the held-out questions
- answering     09, 10: SWIFT's inference engine in the kernel, and the base model's own general answers
- sft           09: `swift sft` as one plan (flags or SftArguments), the original tutorial's recipe, SWIFT's logs
- lora          09, 10: a trained adapter checked, fingerprinted and recorded for notebook 10
- scoring       09, 10: whole answers scored on the held-out questions, per language
- web           09: SWIFT's Web-UI started, reached, mapped to flags and stopped
- inference     10: the recorded adapter, swift export / infer flags, merged-vs-adapter logits, sizes, scores
- devicemap     11: device_map placement planned and timed, DDP+device_map grouping as SWIFT does it
- sharding      11: the ZeRO formulas and ring traffic that 11's script's measured bytes are checked against
- troubleshooting 12: the original tutorial's four tips reproduced, and debugging a hang
"""

from helpers.errors import CourseError

__all__ = ["CourseError"]
