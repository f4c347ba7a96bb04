"""A SWIFT plugin (``--external_plugins``): load models without running Python code shipped in their folder.

SWIFT 4.6 loads every model, config and tokenizer with ``trust_remote_code=True``
(``ModelLoader.default_trust_remote_code`` in ``swift/model/register.py``) and has no flag to change it,
so a model folder that ships ``modeling_*.py`` runs that code. The course's models are standard
architectures (Llama, Qwen2) that need none of their own: this plugin turns the default off.
"""

from swift.model.register import ModelLoader

ModelLoader.default_trust_remote_code = False
