"""Injection (issue #8): every string that reaches a Dockerfile is validated or quoted for its
position. A corpus of hostile values goes into every field; each is refused with exit 2 and
its location, or rendered so that BuildKit's own parser (the ``dockerfile`` package) sees the
same instructions as for a benign value, with the value intact. One real build proves the
accepted ones do not run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dockerfile
import pytest
from helpers import run_cli, unique, write_recipe
from hypothesis import given, settings
from hypothesis import strategies as st

from buildkit_py.render.dockerfile import dockerfile_string, exec_form, shell_word

CANARY = "/tmp/imgbuild-pwned"
HOSTILE = [
    "\n", "a\nRUN touch /pwned", "a\\", "a\\\nRUN touch /pwned", "\\", "\\\\", '"', "'", "\"'", "a\"b",
    "$(touch /pwned)", "`touch /pwned`", "${HOME}", "$HOME", "$", "&& touch /pwned", "; touch /pwned",
    "| touch /pwned", "a || b", "]", "[", '["touch", "/pwned"]', '"]\nRUN touch /pwned #', "\r", "x\rRUN y",
    "\x00", "\t", "\u2028", "\u0085", "# comment", "\\\n", "'\"$\\`", "é", "\x1b[31m", " ", "", "-rf",
    "--mount=type=bind,source=/,target=/host", "a b", "*", "?", "../../etc/passwd", "{{ 7*7 }}",
    "{% raw %}", "\\u0022", "x\\\"y", "a=b", "ONBUILD RUN touch /pwned", "\ufeff", "\x7f",
]
PWN = "touch " + CANARY
VALUES_THAT_BUILD = {  # accepted where quoted: their text must survive unchanged
    "env": [f"$({PWN})", f"`{PWN}`", "a\\", f'"; {PWN}; "', "${HOME}", "'\"$\\`", "a && " + PWN, "\t x"],
    "labels": [f"$({PWN})", f"`{PWN}`", "a\\", '"]\\"', "$HOME", "é ü"],
    "entrypoint": ["/bin/sh", "-c", f"$({PWN})", '"]', "a\\"],
}

RECIPE = {
    "name": "team/inject",
    "version": "1.0",
    "cuda": {"version": "12.4", "source": "wheels"},
    "base": {"image": "debian:bookworm-slim"},
    "python": "3.11",
}
# field -> how to place a value v there (a recipe fragment), for the corpus sweep
FIELDS = {
    "name": lambda v: {"name": v},
    "version": lambda v: {"version": v},
    "base.image": lambda v: {"base": {"image": v}},
    "base.mirror": lambda v: {"base": {"image": "debian:bookworm-slim", "mirror": v}},
    # source: nvidia takes CUDA from the nvidia/cuda image these fields pick (no base.image: None drops it)
    "base.os": lambda v: {"cuda": {"version": "12.4", "source": "nvidia"}, "base": {"image": None, "os": v}},
    "python": lambda v: {"python": v},
    "torch": lambda v: {"torch": v},
    "cuda.version": lambda v: {"cuda": {"version": v, "source": "nvidia"}, "base": {"image": None}},
    "cuda.cudnn": lambda v: {"cuda": {"version": "12.4", "source": "nvidia", "cudnn": v}, "base": {"image": None}},
    "pip": lambda v: {"pip": [v]},
    "pip.version": lambda v: {"pip": ["six==" + v]},
    "pip.extra": lambda v: {"pip": [f"six[{v}]==1.16.0"]},
    "apt": lambda v: {"apt": [v]},
    "apt.version": lambda v: {"apt": ["git=" + v]},
    "env.key": lambda v: {"env": {v: "x"}},
    "env.value": lambda v: {"env": {"A": v}},
    "labels.key": lambda v: {"labels": {v: "x"}},
    "labels.value": lambda v: {"labels": {"team": v}},
    "workdir": lambda v: {"workdir": "/app/" + v},
    "volumes": lambda v: {"volumes": ["/data/" + v]},
    "entrypoint": lambda v: {"entrypoint": ["python", v]},
    "cmd": lambda v: {"cmd": [v]},
    "copy.dest": lambda v: {"copy": [{"src": "app/", "dest": "/app/" + v}]},
    "weights.ref": lambda v: {"weights": [{"ref": v, "mount": "/models"}]},
    "weights.mount": lambda v: {"weights": [{"ref": "r.example.com/m:1", "mount": "/models/" + v}]},
    "build.cuda_arch": lambda v: {"pip": ["flash-attn==2.6.3"], "torch": "2.4.1", "base": {"image": "ubuntu:22.04"},
                                  "build": {"from_source": ["flash-attn"], "cuda_arch": [v]}},
    "build.from_source": lambda v: {"pip": ["six==1.16.0"], "base": {"image": "ubuntu:22.04"},
                                    "build": {"from_source": [v]}},
    "budget.max_size": lambda v: {"budget": {"max_size": v}},
}
BENIGN = {"name": "team/ok", "version": "2.0", "base.image": "debian:bookworm-slim", "base.mirror": "127.0.0.1:9/m",
          "base.os": "ubuntu22.04", "python": "3.11", "torch": "2.4.1", "cuda.version": "12.4", "cuda.cudnn": "9",
          "pip": "six==1.16.0", "pip.version": "1.16.0", "pip.extra": "x", "apt": "git", "apt.version": "1:2.39",
          "env.key": "B", "env.value": "ok", "labels.key": "k", "labels.value": "ok", "workdir": "ok",
          "volumes": "ok", "entrypoint": "ok", "cmd": "ok", "copy.dest": "ok", "weights.ref": "127.0.0.1:9/m:2",
          "weights.mount": "ok", "build.cuda_arch": "8.0", "build.from_source": "six", "budget.max_size": "1GB"}
# Fields whose values are quoted for their position rather than filtered: only a value with
# one of these characters (which no quoting keeps on one line, or which cuts an exec-form
# argument short) may be refused. Refusing more would be a false alarm.
QUOTED_REFUSES = {"env.value": "\n\r\x00", "labels.value": "\n\r\x00", "entrypoint": "\x00", "cmd": "\x00"}


@pytest.fixture(autouse=True)
def offline_bases(monkeypatch):
    """Rendering needs no registry: base lookups (bases.py) answer at once, knowing nothing of the base."""
    try:
        from buildkit_py.compat.bases import BaseFacts
        from buildkit_py.pipeline import bases
    except ImportError:
        return
    monkeypatch.setattr(bases, "fetch_base_facts", lambda ref, client=None: BaseFacts(ref, None))


def merge(base: dict, extra: dict) -> dict:
    """``base`` updated with ``extra`` one level deep; a None value removes the key."""
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
            out[k] = {kk: vv for kk, vv in out[k].items() if vv is not None}
        else:
            out[k] = v
    return out


def write(folder: Path, data: dict) -> Path:
    (folder / "app").mkdir(parents=True, exist_ok=True)
    (folder / "app" / "main.py").write_text("print('hi')\n")
    # JSON is YAML: every hostile character survives, escaped, into the loader.
    return write_recipe(folder, json.dumps(data, ensure_ascii=True))


def render(folder: Path, data: dict):
    path = write(folder, data)
    code, out, err = run_cli("plan", str(path), "--json")
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (0, 2), (code, err)
    return code, json.loads(out), err, path


def shape(text: str) -> list[tuple[str, ...]]:
    """The instruction sequence as BuildKit parses it, with RUN commands in full."""
    return [(c.cmd, *(c.value if c.cmd == "RUN" else ())) for c in dockerfile.parse_string(text)]


def unquote(word: str) -> str:
    """What BuildKit's lexer makes of a double-quoted word (\\ escapes ", $ and \\ only)."""
    assert word.startswith('"') and word.endswith('"'), word
    out, i, body = [], 0, word[1:-1]
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body) and body[i + 1] in '"$\\':
            out.append(body[i + 1])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def instruction_values(text: str, cmd: str) -> list[tuple[str, ...]]:
    return [c.value for c in dockerfile.parse_string(text) if c.cmd == cmd]


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_hostile_corpus_never_adds_or_changes_instructions(tmp_path, field):
    code, benign, err, _ = render(tmp_path / "benign", merge(RECIPE, FIELDS[field](BENIGN[field])))
    assert code == 0, f"the benign value for {field} must render: {err}"
    want = shape(benign["dockerfile"])
    values = HOSTILE + [BENIGN[field] + h for h in HOSTILE]
    refused = []
    for i, value in enumerate(values):
        code, data, err, path = render(tmp_path / f"v{i}", merge(RECIPE, FIELDS[field](value)))
        if code == 2:
            refused.append(value)
            first = err.split("\n", 1)[0]
            assert f"{path}:" in first, err  # located: file and line
            continue
        got = shape(data["dockerfile"])
        # Same instructions, and every RUN byte-identical: no value reached a shell command.
        assert [g[0] for g in got] == [w[0] for w in want], (field, value)
        runs = [g for g in got if g[0] == "RUN"]
        if field not in {"apt", "apt.version", "pip", "pip.version", "pip.extra", "build.from_source"}:
            assert runs == [w for w in want if w[0] == "RUN"], (field, value)
        _assert_value_intact(field, value, data)
    # The benign value with nothing appended ("" is in the corpus) must render, so every sweep
    # reaches the rendering checks; a quoted field refuses only what quoting cannot carry.
    assert BENIGN[field] not in refused, field
    if field in QUOTED_REFUSES:
        assert refused == [v for v in values if any(c in v for c in QUOTED_REFUSES[field])], field


def _assert_value_intact(field: str, value: str, data: dict) -> None:
    text = data["dockerfile"]
    if field == "env.value":
        env = instruction_values(text, "ENV")[-1]
        pairs = dict(zip(env[0::2], env[1::2], strict=False))
        assert unquote(pairs["A"]) == value
    elif field == "labels.value":
        label = instruction_values(text, "LABEL")[-1]
        pairs = {unquote(k): unquote(v) for k, v in zip(label[0::2], label[1::2], strict=False)}
        assert pairs["team"] == value
    elif field in {"entrypoint", "cmd"}:
        (args,) = instruction_values(text, field.upper())[-1:]
        assert list(args) == (["python", value] if field == "entrypoint" else [value])


# --- the filters, as properties ---------------------------------------------------------------

one_line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(value=one_line)
def test_dq_roundtrips_through_buildkit(value):
    text = f"FROM scratch\nENV A={dockerfile_string(value)} B=\"x\"\nLABEL k={dockerfile_string(value)}\n"
    cmds = dockerfile.parse_string(text)
    assert [c.cmd for c in cmds] == ["FROM", "ENV", "LABEL"]
    assert cmds[1].value[0] == "A" and unquote(cmds[1].value[1]) == value and cmds[1].value[2:] == ("B", '"x"')
    assert unquote(cmds[2].value[1]) == value


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
                       min_size=1, max_size=4))
def test_exec_form_roundtrips_through_buildkit(values):
    text = f"FROM scratch\nENTRYPOINT {exec_form(values)}\nCMD [\"x\"]\n"
    cmds = dockerfile.parse_string(text)
    assert [c.cmd for c in cmds] == ["FROM", "ENTRYPOINT", "CMD"]
    assert list(cmds[1].value) == values and cmds[1].json


@settings(max_examples=300, deadline=None)
@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"), max_size=30))
def test_shell_word_is_one_word_in_a_run_line(value):
    text = f"FROM scratch\nRUN echo {shell_word(value)} \\\n    done\n"
    cmds = dockerfile.parse_string(text)
    assert [c.cmd for c in cmds] == ["FROM", "RUN"]
    import shlex

    assert shlex.split(cmds[1].value[0]) == ["echo", value, "done"]


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b"])
def test_filters_refuse_line_breaks(value):
    with pytest.raises(ValueError):  # noqa: PT011
        dockerfile_string(value)
    with pytest.raises(ValueError):  # noqa: PT011
        shell_word(value)
    if value == "a\x00b":
        with pytest.raises(ValueError):  # noqa: PT011
            exec_form([value])


# --- tags (argv, not the Dockerfile) -------------------------------------------------------------


@pytest.mark.parametrize("tag", ["x:1\nRUN y", "-x", "x:1 --push", "X:1", "x:$(id)", "x:1;id", "x@sha256:00"])
def test_hostile_tags_refused_before_any_build(tmp_path, tag, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # never reaches an engine
    path = write(tmp_path, RECIPE)
    code, _, err = run_cli("build", str(path), f"--tag={tag}", "--engine", "docker", "--progress", "quiet")
    assert code == 2, err
    assert "is not a valid image reference" in err


# --- nothing runs during a real build ---------------------------------------------------------------


def test_hostile_values_do_not_run_in_a_build(tmp_path, docker_client, base_image, cleanup_images):
    name = unique("imgbuild-test/hostile")
    env = {f"V{i}": v for i, v in enumerate(VALUES_THAT_BUILD["env"])}
    labels = {f"l{i}": v for i, v in enumerate(VALUES_THAT_BUILD["labels"])}
    # flavor base: cudart alone, not the runtime tier's ~2 GB of wheels
    data = merge(RECIPE, {"name": name, "base": {"image": base_image}, "cuda": {"flavor": "base"}, "env": env,
                          "labels": labels,
                          "entrypoint": VALUES_THAT_BUILD["entrypoint"], "cmd": [f"$({PWN})"]})
    path = write(tmp_path, data)
    code, out, err = run_cli("build", str(path), "--json", "--progress", "plain")
    assert code == 0, err[-3000:]
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    image = docker_client.images.get(report["image_id"])
    config = image.attrs["Config"]
    got_env = dict(e.split("=", 1) for e in config["Env"])
    for k, v in env.items():
        assert got_env[k] == v
    for k, v in labels.items():
        assert config["Labels"][k] == v
    assert config["Entrypoint"] == VALUES_THAT_BUILD["entrypoint"] and config["Cmd"] == [f"$({PWN})"]
    # nothing ran: no canary file, and the build log never executed the values
    probe = subprocess.run(["/usr/bin/docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/ls",
                            report["image_id"], "-d", CANARY], capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No such file" in probe.stderr, probe

