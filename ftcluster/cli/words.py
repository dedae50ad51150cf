"""The CLI's text types: values that reach a job, a container or a file, refused naming the
option when they cannot be used as given."""

from __future__ import annotations

from typing import Any

import click


class Word(click.ParamType):
    """A non-empty string without control characters: a path or a program that reaches a job."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip() or any(ord(c) < 32 or ord(c) == 127 for c in text):
            self.fail(f"{value!r} is empty or holds a control character", param, ctx)
        return text


class DockerRef(click.ParamType):
    """An image reference as the spec's image fields take it (ftcluster.spec.DOCKER_REF_RE)."""

    name = "image"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ftcluster.spec import DOCKER_REF_RE

        if not DOCKER_REF_RE.fullmatch(str(value)):
            self.fail(f"{value!r}: use letters, digits and '_.:/@-' only (a Docker reference)", param, ctx)
        return str(value)
