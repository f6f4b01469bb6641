"""Templates from OCI images (a registry on loopback, with and without credentials) and
from Dockerfiles."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from e2b import BuildException, Sandbox, Template

from conftest import Images, unique


def run(sandbox: Sandbox, command: str, **kwargs) -> str:
    return sandbox.commands.run(command, **kwargs).stdout.strip()


def test_from_image_without_credentials(images: Images, cleanup) -> None:
    name = cleanup(unique("from-image"))
    Template.build(
        Template().from_image(images.plain).run_cmd("echo built-on-image > /etc/step-marker", user="root"),
        name,
    )
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert run(sandbox, "cat /etc/image-marker") == "made by the template suite"
        assert run(sandbox, "cat /etc/step-marker") == "built-on-image"
        assert run(sandbox, "echo $GREETING") == "from-image", "the image's ENV is kept"
        # E2B's user phase: `user` exists (uid 1000) with a home, and is the default user.
        assert run(sandbox, "id -u") == "1000"
        assert run(sandbox, "echo $HOME") == "/home/user"
        assert run(sandbox, "id -u", user="root") == "0"
    finally:
        sandbox.kill()


def test_from_image_with_credentials_and_without(images: Images, cleanup) -> None:
    name = cleanup(unique("private-image"))
    with pytest.raises(BuildException) as refused:
        Template.build(Template().from_image(images.private), name)
    assert "401" in str(refused.value) or "unauthorized" in str(refused.value).lower() or "credentials" in str(refused.value).lower(), str(refused.value)
    with pytest.raises(BuildException):
        Template.build(Template().from_image(images.private, username="puller", password="wrong"), name)
    Template.build(Template().from_image(images.private, username="puller", password="s3cret-pw"), name)
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert run(sandbox, "cat /etc/image-marker") == "made by the template suite"
    finally:
        sandbox.kill()


def test_from_dockerfile(images: Images, tmp_path: Path, cleanup) -> None:
    (tmp_path / "app.sh").write_text("#!/bin/sh\necho app says $APP_MODE\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/settings.ini").write_text("[main]\nvalue=42\n")
    dockerfile = f"""
FROM {images.plain}
ARG FLAVOUR=crisp
ENV APP_MODE=production LABEL_FLAVOUR=$FLAVOUR
WORKDIR /srv/app
COPY app.sh ./app.sh
COPY conf /etc/app
RUN chmod +x /srv/app/app.sh && echo "dockerfile-run as $(id -u)" > /srv/app/run-marker
USER user
"""
    name = cleanup(unique("dockerfile"))
    Template.build(Template(file_context_path=str(tmp_path)).from_dockerfile(dockerfile), name)
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert run(sandbox, "/srv/app/app.sh") == "app says production"
        assert run(sandbox, "echo $LABEL_FLAVOUR") == "crisp"
        assert run(sandbox, "cat /etc/app/settings.ini").endswith("value=42")
        assert run(sandbox, "cat /srv/app/run-marker") == "dockerfile-run as 0"
        assert run(sandbox, "pwd") == "/srv/app"
        assert run(sandbox, "whoami") == "user"
    finally:
        sandbox.kill()


def test_the_sdk_default_base_image_is_berths_base(api: httpx.Client, cleanup) -> None:
    """`Template()` without a `from_*` (and `from_base_image()`) names E2B's base image,
    which on berth is the `base` template: no public registry is contacted."""
    name = cleanup(unique("default-base"))
    Template.build(Template().from_base_image().run_cmd("echo on-base > ~/where"), name)
    sandbox = Sandbox.create(name, timeout=60)
    try:
        assert run(sandbox, "cat ~/where") == "on-base"
        assert run(sandbox, "command -v python3 node git curl | wc -l") == "4"
    finally:
        sandbox.kill()
