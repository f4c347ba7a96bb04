"""The course's small library, one module per concept.

- paths      where the repository, build/ (run outputs) and build/outputs/ (what you train) are
- errors     CourseError: a one-sentence error for learners, shown without a traceback
- profiles   cpu / gpu / smoke / auto: resolve and validate a notebook's parameters
- models     make the course models available offline (SmolLM2, a tiny smoke model, ModelScope ids)
- launching  run torchrun and the swift CLI from a cell: live rank-prefixed output, timeouts, results
- environment installed versions against the pins, accelerators and distributed backends
- report     record a notebook's key metrics (collected into the run report) and show tables
- plots      the course's plot style and a timeline of measured intervals
- exercises  checkers that tell a learner whether an exercise answer is right
- runner     execute the notebooks with papermill, render HTML, write build/report.{md,json}
"""

from helpers.errors import CourseError, install_notebook_handler

__all__ = ["CourseError"]

install_notebook_handler()
