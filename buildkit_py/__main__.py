from buildkit_py.cli.main import entrypoint

entrypoint()
