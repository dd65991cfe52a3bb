"""pip.conf has one reader (compat/pip_config.py), used by the torch look-up's index settings and
the uv translation of --pip-config, and it refuses what pip refuses (issue 23: 3: a file with
index-url twice was taken by the installer and refused by the look-up)."""

import os
import subprocess
import sys

import pytest

from buildkit_py.compat import index
from buildkit_py.compat.pip_config import parse_pip_config
from buildkit_py.errors import ExitStatus, PipConfigError
from buildkit_py.plan.installer import uv_env_from_pip_config

TWICE = "[global]\nindex-url = https://a.example/simple\nindex-url = https://b.example/simple\n"


def pip_config_list(path) -> subprocess.CompletedProcess:
    """pip's own answer to the file (no network: `pip config list` only reads configuration)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": str(path)}
    return subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_a_key_set_twice_is_refused_by_both_readers_at_its_line(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(TWICE)
    with pytest.raises(PipConfigError) as uv:
        uv_env_from_pip_config(TWICE, str(conf))
    with pytest.raises(PipConfigError) as lookup:
        index.index_settings(pip_config=str(conf), env={"HOME": str(tmp_path)})
    assert uv.value.message == lookup.value.message == f"--pip-config {conf}:3: [global] index-url: set twice " \
                                                       "(pip refuses such a file)"
    assert uv.value.exit_status == ExitStatus.BAD_INPUT
    # the same file found among pip's own (PIP_CONFIG_FILE) is refused too, named as pip's
    with pytest.raises(PipConfigError, match=f"pip configuration {conf}:3: "):
        index.index_settings(env={"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf)})


@pytest.mark.parametrize(("text", "refused"), [
    (TWICE, True),
    ("[global]\nindex-url = https://a.example/simple\nindex_url = https://b.example/simple\n", True),
    ("[global]\ntimeout = 5\n[global]\nretries = 2\n", True),
    ("[global]\nindex-url = https://a.example/simple\n[install]\nindex-url = https://b.example/simple\n", False),
])
def test_what_pip_refuses_is_what_the_reader_refuses(tmp_path, text, refused):
    conf = tmp_path / "pip.conf"
    conf.write_text(text)
    proc = pip_config_list(conf)
    assert (proc.returncode != 0) == refused, proc.stdout + proc.stderr
    if refused:
        assert "could not be loaded" in proc.stderr
        with pytest.raises(PipConfigError):
            parse_pip_config(text, str(conf))
    else:
        assert parse_pip_config(text, str(conf)).value("index-url") == "https://b.example/simple"


def test_both_readers_spell_keys_as_pip_does(tmp_path):
    """pip reads index_url and --index-url as index-url; the look-up read only index-url."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex_url = https://mirror.example/simple\n--cert = /ca.pem\n")
    settings = index.index_settings(pip_config=str(conf), env={"HOME": str(tmp_path)})
    assert (settings.url, settings.cafile) == ("https://mirror.example/simple", "/ca.pem")
    assert uv_env_from_pip_config(conf.read_text(), ca_cert=True) == {"UV_INDEX_URL": "https://mirror.example/simple"}
    assert "global.index-url='https://mirror.example/simple'" in pip_config_list(conf).stdout


def test_a_pip_config_that_cannot_be_read_is_an_error_not_pypi(tmp_path):
    with pytest.raises(PipConfigError, match="cannot read it"):
        index.index_settings(pip_config=str(tmp_path / "missing.conf"), env={"HOME": str(tmp_path)})
    assert index.index_settings(env={"HOME": str(tmp_path)}).url == index.PYPI  # pip's own places: none here


def test_an_error_never_shows_a_value(tmp_path):
    text = "[global]\nindex-url = https://user:s3cret@mirror.example/simple\n  more\n!!! s3cret\n"
    with pytest.raises(PipConfigError) as info:
        parse_pip_config(text, "pip.conf")
    assert "pip.conf:4: not a pip.conf" in info.value.message and "s3cret" not in info.value.render()
