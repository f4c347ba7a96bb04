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
"""

import logging

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
