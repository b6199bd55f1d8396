"""A run's CURVE key set on disk: made once, never overwritten, read back checked, and never
shown: no secret in a file's permissions for others, an error message or a repr."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import zmq

from hopbus.errors import ConfigError
from hopbus.transport.curve import CurveKeys, generate, key_files

NAMES = ["server.key", "server.key_secret", "client.key", "client.key_secret"]


def secrets_of(folder: Path) -> list[str]:
    """The secret keys' text in ``folder``'s files, to look for where it must never be."""
    found = []
    for f in folder.glob("*.key_secret"):
        _, secret = zmq.auth.load_certificate(f)
        assert secret is not None
        found.append(secret.decode())
    return found


def test_generate_writes_a_set_with_private_secrets(tmp_path):
    folder = tmp_path / "keys" / "run-1"  # parents are made
    written = generate(folder)
    assert [p.name for p in written] == NAMES == [p.name for p in key_files(folder)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(NAMES)  # no staging left
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    for p in written:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o600 if p.name.endswith("_secret") else 0o644), (p.name, oct(mode))
    keys = CurveKeys.load(folder)
    assert keys.server_public != keys.client_public
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    assert keys.allowed_clients == {keys.client_public}
    shown = repr(keys) + str(keys)
    for text in (keys.server_secret, keys.client_secret, keys.server_public):
        assert text.decode() not in shown
    assert str(folder) in shown


def test_generate_refuses_to_overwrite_any_file_of_a_set(tmp_path):
    generate(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="refusing to overwrite") as info:
        generate(tmp_path)
    assert "\n" not in str(info.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    for secret in secrets_of(tmp_path):
        assert secret not in str(info.value)
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "client.key_secret").write_text("mine")  # one file of a set is enough to refuse
    with pytest.raises(ConfigError, match=r"client\.key_secret"):
        generate(lone)
    assert [p.name for p in lone.iterdir()] == ["client.key_secret"]


def test_generate_into_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        generate(tmp_path / "f")


@pytest.mark.parametrize(
    ("damage", "expect"),
    [
        (shutil.rmtree, "does not exist"),
        (lambda d: (d / "server.key_secret").unlink(), r"server\.key_secret is missing"),
        (lambda d: (d / "client.key").unlink(), r"client\.key is missing"),
        (lambda d: (d / "client.key").write_text("hello\n"), r"client\.key is not a ZeroMQ"),
        (
            lambda d: (d / "server.key_secret").write_bytes(b"\xff\xfe\x00garbage"),
            r"server\.key_secret (lacks|is not)",
        ),
        (
            lambda d: (d / "server.key_secret").write_text(
                (d / "server.key_secret").read_text().replace("secret-key", "#secret-key")
            ),
            r"server\.key_secret lacks a well-formed secret",
        ),
    ],
)
def test_load_names_the_missing_or_bad_file_and_the_command(tmp_path, damage, expect):
    folder = tmp_path / "k"
    generate(folder)
    secrets = secrets_of(folder)
    damage(folder)
    with pytest.raises(ConfigError, match=expect) as info:
        CurveKeys.load(folder)
    message = str(info.value)
    assert "\n" not in message
    assert "hopbus keys generate" in message
    assert not any(s in message for s in secrets)


def test_load_refuses_a_secret_from_another_set(tmp_path):
    generate(tmp_path / "a")
    generate(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "client.key_secret", tmp_path / "a" / "client.key_secret")
    with pytest.raises(ConfigError, match=r"does not belong with client\.key") as info:
        CurveKeys.load(tmp_path / "a")
    assert not any(s in str(info.value) for s in secrets_of(tmp_path / "b"))


def test_load_of_an_unreadable_file_is_one_line(tmp_path):
    generate(tmp_path)
    (tmp_path / "client.key_secret").unlink()
    (tmp_path / "client.key_secret").mkdir()
    with pytest.raises(ConfigError, match=r"client\.key_secret is not a file"):
        CurveKeys.load(tmp_path)


def test_generate_on_a_filesystem_without_hard_links(tmp_path, monkeypatch):
    """Some network and FUSE mounts refuse link(2): the files are then created exclusively,
    with the same modes."""

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    written = generate(tmp_path / "k")
    for p in written:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o600 if p.name.endswith("_secret") else 0o644), (p.name, oct(mode))
    assert CurveKeys.load(tmp_path / "k").allowed_clients
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate(tmp_path / "k")
