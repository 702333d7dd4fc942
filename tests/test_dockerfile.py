"""Dockerfile parsing and planning (conch/sandbox/dockerfile.py, conch/sandbox/buildplan.py): syntax,
substitution, and the clear errors for what the local backend cannot reproduce. No sandbox needed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conch.sandbox.base import SandboxError
from conch.sandbox.buildplan import DOCKER_DEFAULT_PATH, plan
from conch.sandbox.dockerfile import expand, parse, split_words

DF = Path("/ctx/Dockerfile")


def parsed(text: str):
    return parse(DF, textwrap.dedent(text))


def planned(text: str, **kw):
    return plan(parsed(text), **kw)


def test_continuations_comments_and_lines():
    df = parsed("""\
        # syntax=docker/dockerfile:1
        FROM debian:bookworm

        # a comment
        RUN apt-get update && \\
            # comment inside a continuation is dropped
            apt-get install -y curl \\

            && echo done
        run   echo lower-case keyword
        """)
    kinds = [(i.keyword, i.line) for i in df.instructions]
    assert kinds == [("FROM", 2), ("RUN", 5), ("RUN", 10)]
    run = df.instructions[1]
    assert "apt-get update &&" in run.value and "apt-get install -y curl" in run.value
    assert run.value.endswith("&& echo done")
    assert "comment" not in run.value


def test_escape_directive_backtick():
    df = parse(DF, "# escape=`\nFROM x\nRUN echo a `\n  b\n")
    assert df.escape == "`"
    assert df.instructions[1].value == "echo a   b"


def test_json_and_shell_forms():
    p = planned("""\
        FROM x
        RUN ["python3", "-c", "print('hi there')"]
        RUN echo "$HOME" > /tmp/x
        SHELL ["/bin/bash", "-o", "pipefail", "-c"]
        RUN false | true
        CMD ["bash", "-l"]
        ENTRYPOINT exec python3 app.py
        """)
    runs = [s for s in p.steps if s.kind == "run"]
    assert runs[0].argv == ("python3", "-c", "print('hi there')")
    assert runs[1].argv == ("/bin/sh", "-c", 'echo "$HOME" > /tmp/x')  # shell expands RUN, not the parser
    assert runs[2].argv == ("/bin/bash", "-o", "pipefail", "-c", "false | true")
    assert p.config.cmd == ("bash", "-l")
    assert p.config.entrypoint == ("/bin/bash", "-o", "pipefail", "-c", "exec python3 app.py")


def test_arg_defaults_substitution_and_scope():
    p = planned("""\
        ARG TAG=3.12
        ARG UNUSED
        FROM python:${TAG}-slim
        ARG TAG
        ARG VERSION=1.${TAG}
        ARG EMPTY
        ENV V=$VERSION W=${MISSING:-fallback} X=${VERSION:+set} Y=${EMPTY:-e}
        RUN echo hi
        """)
    assert p.config.base_image == "python:3.12-slim"
    env = dict(p.config.env)
    assert env["V"] == "1.3.12" and env["W"] == "fallback" and env["X"] == "set" and env["Y"] == "e"
    assert "TAG" not in env and "VERSION" not in env  # ARGs are not image env
    run_env = dict(p.steps[0].env)
    assert run_env["VERSION"] == "1.3.12" and run_env["TAG"] == "3.12"  # but RUN sees them
    overridden = planned("ARG TAG=3.12\nFROM python:${TAG}\n", build_args={"TAG": "3.13"})
    assert overridden.config.base_image == "python:3.13"


def test_env_both_forms_and_quoting():
    p = planned("""\
        FROM x
        ENV A=1 B="two words" C='single $A' D=with\\ space
        ENV LEGACY value with  spaces $A
        ENV PATH=/opt/bin:$PATH
        ENV SAME=$A A=2 AFTER=$A
        """)
    env = dict(p.config.env)
    assert env["A"] == "2"
    assert env["B"] == "two words"
    assert env["C"] == "single $A"
    assert env["D"] == "with space"
    assert env["LEGACY"] == "value with spaces 1"
    assert env["PATH"] == "/opt/bin:" + DOCKER_DEFAULT_PATH  # extends the FROM image's PATH
    assert env["SAME"] == "1" and env["AFTER"] == "1"  # one ENV line sees the values from before it


def test_workdir_copy_destinations():
    p = planned("""\
        FROM x
        WORKDIR /app
        WORKDIR src/../lib
        COPY a.txt ./
        COPY a.txt b.txt conf/
        COPY dir /opt/dir
        COPY *.py /scripts
        COPY --chown=1000:1000 --chmod=640 x y
        ADD local.tar.gz /vendor/
        """)
    steps = p.steps
    assert [s.kind for s in steps] == ["workdir", "workdir", "copy", "copy", "copy", "copy", "copy", "copy"]
    assert steps[1].dest == "/app/lib" and p.config.workdir == "/app/lib"
    assert steps[2].dest == "/app/lib/"
    assert steps[3].sources == ("a.txt", "b.txt") and steps[3].dest == "/app/lib/conf/"
    assert steps[4].dest == "/opt/dir"
    assert steps[5].dest == "/scripts/"  # a glob always copies into a directory
    assert steps[6].chown == "1000:1000" and steps[6].chmod == "640" and steps[6].dest == "/app/lib/y"
    assert steps[7].add and steps[7].sources == ("local.tar.gz",)


def test_heredocs():
    p = planned("""\
        FROM x
        ARG WHO=world
        RUN <<EOF
        set -e
        echo "hello $WHO"
        EOF
        RUN python3 <<'PY' > /out
        print("x $y")
        PY
        RUN <<EOT
        #!/usr/bin/env python3
        print("py script")
        EOT
        COPY <<CONF /etc/app.conf
        who=$WHO
        CONF
        COPY <<'RAW' /etc/raw.conf
        who=$WHO
        RAW
        """)
    r1, r2, r3, c1, c2 = p.steps
    assert r1.argv == ("/bin/sh",) and r1.stdin == 'set -e\necho "hello $WHO"\n'
    assert r2.argv == ("/bin/sh", "-c", "python3 <<'PY' > /out\nprint(\"x $y\")\nPY")
    assert r3.argv == ("/usr/bin/env", "python3", "/dev/stdin")
    assert c1.inline == (("CONF", "who=world\n"),) and c1.dest == "/etc/app.conf"
    assert c2.inline == (("RAW", "who=$WHO\n"),)


def test_ignored_and_recorded_instructions():
    p = planned("""\
        FROM x AS final
        LABEL maintainer="me" version=1
        EXPOSE 8080 9090/udp
        VOLUME /data
        STOPSIGNAL SIGTERM
        HEALTHCHECK --interval=5s CMD true
        MAINTAINER someone
        USER root
        USER 0:0
        """)
    assert p.steps == ()
    assert dict(p.config.labels) == {"maintainer": "me", "version": "1"}
    assert p.config.exposed == ("8080", "9090/udp")


@pytest.mark.parametrize("body, line, needle", [
    ("FROM a AS b\nCOPY --from=b /x* /x/\n", 2, "COPY --from with a wildcard source"),
    ("FROM a\nADD https://example.com/f.tgz /f\n", 2, "ADD from a URL"),
    ("FROM a\nONBUILD RUN make\n", 2, "ONBUILD"),
    ("FROM a\nUSER nobody\n", 2, "USER nobody"),
    ("FROM a\nRUN --mount=type=secret,id=x cat /run/secrets/x\n", 2, "RUN --mount=type=secret"),
])
def test_unsupported_instructions_name_file_line_and_suggest_docker(body, line, needle):
    with pytest.raises(SandboxError) as err:
        plan(parse(DF, body))
    msg = str(err.value)
    assert f"{DF}:{line}:" in msg
    assert needle in msg
    assert "--sandbox docker" in msg


def test_multi_stage_files_are_split_before_planning(tmp_path, base_root):
    from conch.sandbox.buildplan import split_stages
    from conch.sandbox.localbuild import build_image

    body = "ARG V=1\nFROM a AS build\nRUN make\nFROM build\nCOPY --from=build /out /out\nFROM b\n"
    assert [alias for alias, _ in split_stages(parse(DF, body))] == ["build", "", ""]
    with pytest.raises(SandboxError, match="a second FROM: plan\\(\\) takes one build stage"):
        plan(parse(DF, body))
    (tmp_path / "Dockerfile").write_text("FROM python:3.13\nCOPY --from=builder /x /x\n")
    with pytest.raises(SandboxError, match=r"Dockerfile:2: COPY --from=builder: no earlier build stage"):
        build_image(tmp_path, tmp_path / "Dockerfile", quiet=True)


@pytest.mark.parametrize("body, needle", [
    ("RUN echo before from\n", "RUN before FROM"),
    ("FROM a\nFROBNICATE x\n", "unknown instruction 'FROBNICATE'"),
    ("FROM a\nRUN cat <<EOF\nno end\n", "heredoc <<EOF is not terminated"),
    ("FROM a\nENV =bad\n", "ENV"),
    ("FROM a\nCOPY onlyone\n", "COPY needs at least one source"),
    ("ARG X\n", "no FROM"),
])
def test_syntax_errors_are_clear(body, needle):
    with pytest.raises(SandboxError, match="Dockerfile"):
        try:
            plan(parse(DF, body))
        except SandboxError as exc:
            assert needle in str(exc)
            raise


def test_run_cache_mount_is_accepted_with_a_note():
    p = planned("FROM a\nRUN --mount=type=cache,target=/root/.cache/pip pip install x\n")
    assert p.steps[0].argv[-1] == "pip install x"
    assert any("type=cache ignored" in n for n in p.notes)


def test_word_splitting_and_expansion():
    env = {"A": "x y", "E": ""}
    assert split_words('a "b c" \'d $A\' $A e\\ f', env) == ["a", "b c", "d $A", "x y", "e f"]
    assert expand("${E:-dflt}/${E-set}/${A:+alt}", env) == "dflt//alt"
    with pytest.raises(ValueError):
        split_words('"unterminated', env)
