"""The engines, one module per kind: each defines its engine class (the ``Engine`` protocol of
``engine/base.py``) and registers it with ``@registry.register``. The registry imports every
module here the first time it is read, so a new engine is a new module here plus its tests:
nothing else names it (select.py, the CLI's --engine choices and the callers of the engine all
go through the registry and the engine object)."""
