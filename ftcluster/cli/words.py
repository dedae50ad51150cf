"""The CLI's text types: values that reach a job, a container or a file, refused naming the
option when they cannot be used as given."""

from __future__ import annotations

from typing import Any

import click


class Word(click.ParamType):
    """A non-empty string of visible text (ftcluster.spec.plaintext): a path or a program that reaches a job."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        # startup: only when an option's value is checked, not for --help
        from ftcluster.spec.plaintext import not_text

        text = str(value)
        if not text.strip():
            self.fail(f"{value!r} is empty", param, ctx)
        if why := not_text(text):
            self.fail(f"{value!r} holds {why}", param, ctx)
        return text


class DockerRef(click.ParamType):
    """An image reference as the spec's image fields take it (ftcluster.spec.cluster.DOCKER_REF_RE)."""

    name = "image"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        # startup: the spec models (pydantic) only when an image option is given
        from ftcluster.spec.cluster import DOCKER_REF_RE

        if not DOCKER_REF_RE.fullmatch(str(value)):
            self.fail(f"{value!r}: use letters, digits and '_.:/@-' only (a Docker reference)", param, ctx)
        return str(value)
