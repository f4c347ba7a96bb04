"""A SWIFT plugin (``--external_plugins``): load models without running Python code shipped in their folder.

SWIFT 4.6 reads every model folder with ``trust_remote_code=True`` and has no flag to change it: its
loaders (``ModelLoader.default_trust_remote_code`` in ``swift/model/register.py``) and, before them, the
function that inspects the folder (``_get_model_info`` in ``swift/model/model_meta.py``, which calls
``AutoConfig.from_pretrained(model_dir, trust_remote_code=True)`` whatever the loaders say). A folder
that ships ``configuration_*.py`` or ``modeling_*.py`` runs that code. The course's models are standard
architectures (Llama, Qwen2) that need none of their own, so this plugin turns both off, and drops
SWIFT's "Loading ... with trust_remote_code=True" warnings, which are no longer true once it is loaded.
SWIFT also passes ``trust_remote_code=True`` to ``datasets.load_dataset``, which runs no dataset scripts
since datasets 4.0 and logs an error-level notice saying so; that notice is dropped too.

Each rank that loads it also ends its process group when it exits. SWIFT's ``swift sft`` (outside
Megatron) never calls ``destroy_process_group``, so a gloo rank can reach interpreter shutdown with
gloo's threads still alive and, now and then, die there with SIGABRT ("terminate called without an
active exception") after training has finished. After an uncaught error the group is left alone: the
other ranks may still be waiting in a collective, and the launcher reports the error.
"""

import atexit
import logging
import sys

import torch.distributed as dist
from swift.model import model_meta
from swift.model.register import ModelLoader
from transformers import AutoConfig

ModelLoader.default_trust_remote_code = False  # SWIFT's loaders of model, config and tokenizer


class _ConfigWithoutRemoteCode:
    """``AutoConfig`` for ``_get_model_info``, with ``trust_remote_code`` forced to False."""

    @staticmethod
    def from_pretrained(*args, **kwargs):
        kwargs["trust_remote_code"] = False  # whatever SWIFT passed
        return AutoConfig.from_pretrained(*args, **kwargs)


model_meta.AutoConfig = _ConfigWithoutRemoteCode


class _NoStaleWarning(logging.Filter):
    local_code_only = True  # marks the filter, so that loading the plugin twice adds it once

    def filter(self, record: logging.LogRecord) -> bool:
        return "with trust_remote_code=True" not in record.getMessage()


class _NoDatasetsNotice(logging.Filter):
    local_code_only = True  # the same mark

    def filter(self, record: logging.LogRecord) -> bool:
        return "`trust_remote_code` is not supported anymore" not in record.getMessage()


for _name, _filter in (("swift", _NoStaleWarning), ("datasets.load", _NoDatasetsNotice)):
    _logger = logging.getLogger(_name)
    if not any(getattr(f, "local_code_only", False) for f in _logger.filters):
        _logger.addFilter(_filter())


def _end_process_group() -> None:
    """At exit: destroy the process group this rank opened, unless it is ending on an uncaught error."""
    if getattr(sys, "last_value", None) is None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # what the rank's script would call last


atexit.register(_end_process_group)  # loaded twice, the second call finds no group left
