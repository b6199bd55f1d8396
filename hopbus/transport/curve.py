"""A run's ZeroMQ CURVE keys: who may put updates into a worker's inbox.

Without CURVE, anyone who can reach an inbox's TCP port can push frames that pass every check
(the run id and worker ids are no secret), and so steer a worker's model. With CURVE, every
inbox serves with the run's "server" keypair and admits only clients that prove they hold the
run's "client" secret key (a ZAP authenticator checks the client's public key), so a process
without the run's keys never completes a handshake: its frames never reach the inbox, let
alone the update store. Every connection is also encrypted.

A key set is one folder, made by ``hopbus keys generate DIR``:

- ``server.key`` / ``server.key_secret``: every inbox serves with this keypair;
- ``client.key`` / ``client.key_secret``: every outbox connects with this keypair.

The files are ZeroMQ's own certificate format (``zmq.auth.create_certificates``). Every process
of a run both receives and sends, so every machine of the run needs the whole folder; the two
``*_secret`` files must go to the run's machines only (mode 0600). Key material never appears
in an error message, a log line or a ``repr``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
import zmq.utils.z85

from hopbus.errors import ConfigError

SERVER = "server"
CLIENT = "client"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
KEY_LEN = 40  # a Z85-encoded 32-byte Curve25519 key
MAKE = "hopbus keys generate DIR"


def require_curve() -> None:
    """One line if this libzmq cannot do CURVE (built without libsodium/tweetnacl)."""
    if not zmq.has("curve"):
        raise ConfigError(
            f"--curve: this libzmq ({zmq.zmq_version()}) was built without CURVE security; "
            "install a pyzmq wheel (they bundle a libzmq with CURVE)"
        )


def key_files(folder: Path) -> list[Path]:
    """The four files of a key set, public before secret, server before client."""
    suffixes = (PUBLIC_SUFFIX, SECRET_SUFFIX)
    return [folder / f"{name}{suffix}" for name in (SERVER, CLIENT) for suffix in suffixes]


def generate(folder: Path) -> list[Path]:
    """Write a new key set into ``folder`` (created if missing, mode 0700) and return the files
    written. Refuses, with one line, to overwrite any file of an existing set: replacing the
    keys of a live run would lock its own workers out.

    The keys are made in a private temporary folder inside ``folder`` and linked into place
    one by one (a link never replaces a file), so a secret file is never readable by others,
    not even for a moment, and two generators racing cannot mix their sets."""
    require_curve()
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"key folder {str(folder)!r} is not a directory")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create key folder {str(folder)!r}: {exc.strerror}") from None
    targets = key_files(folder)
    existing = [p.name for p in targets if p.exists()]
    if existing:
        raise ConfigError(
            f"{str(folder)!r} already holds a key set ({', '.join(existing)}): refusing to "
            "overwrite it (a run using it would lock its own workers out); choose a new folder"
        )
    written: list[Path] = []
    try:
        staging = Path(tempfile.mkdtemp(prefix=".hopbus-keys-", dir=folder))  # mode 0700
    except OSError as exc:
        raise ConfigError(f"cannot write to key folder {str(folder)!r}: {exc.strerror}") from None
    try:
        for name in (SERVER, CLIENT):
            public, secret = zmq.auth.create_certificates(staging, name)
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
        for target in targets:
            _place(staging / target.name, target)  # FileExistsError if one appeared since
            written.append(target)
    except FileExistsError as exc:
        for path in written:  # a half set is worse than none
            with contextlib.suppress(OSError):
                path.unlink()
        raise ConfigError(
            f"{str(folder)!r}: {Path(str(exc.filename2 or exc.filename)).name} appeared while "
            "the keys were being written (another hopbus keys generate?): refusing to "
            "overwrite it"
        ) from None
    except OSError as exc:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        raise ConfigError(f"cannot write to key folder {str(folder)!r}: {exc.strerror}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _place(made: Path, target: Path) -> None:
    """Put the file ``made`` at ``target``, never replacing one: a hard link, or, where the
    filesystem has none (some network and FUSE mounts), an exclusive create with its mode."""
    try:
        os.link(made, target)
    except FileExistsError:
        raise
    except OSError:
        mode = stat.S_IMODE(made.stat().st_mode)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(made.read_bytes())


def _read(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    """(public key, secret key or None) of one certificate file, checked; a one-line
    ConfigError that names the file, never its content, otherwise."""
    again = f"make a key set with `{MAKE}` and give its folder to --curve"
    if not path.is_file():
        why = "is not a file" if path.exists() else "is missing"
        raise ConfigError(f"--curve: {path} {why}; {again}")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except OSError as exc:
        raise ConfigError(f"--curve: cannot read {path}: {exc.strerror or 'unreadable'}") from None
    except (ValueError, UnicodeDecodeError, IndexError):
        raise ConfigError(f"--curve: {path} is not a ZeroMQ certificate; {again}") from None
    if not _well_formed(public) or (secret and not _well_formed(secret_key)):
        what = "secret and public key" if secret else "public key"
        raise ConfigError(f"--curve: {path} lacks a well-formed {what}; {again}")
    return public, secret_key if secret else None


def _well_formed(key: bytes | None) -> bool:
    if key is None or len(key) != KEY_LEN:
        return False
    try:
        return len(zmq.utils.z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True, repr=False, eq=False)
class CurveKeys:
    """A run's key set, loaded: what inboxes serve with and outboxes connect with.

    Keys are Z85 bytes, as pyzmq's socket options take them. ``repr`` names the folder only."""

    folder: Path
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    allowed_clients: frozenset[bytes]  # public keys an inbox admits

    @classmethod
    def load(cls, folder: Path) -> CurveKeys:
        """The key set in ``folder`` (as ``generate`` writes it), each secret checked against
        its public key; one ConfigError line naming the file that is missing or wrong."""
        require_curve()
        folder = Path(folder)
        if not folder.is_dir():
            why = "is not a directory" if folder.exists() else "does not exist"
            raise ConfigError(
                f"--curve {str(folder)!r} {why}: give the folder `{MAKE}` wrote the run's keys to"
            )
        keys: dict[str, tuple[bytes, bytes]] = {}
        for name in (SERVER, CLIENT):
            public, _ = _read(folder / f"{name}{PUBLIC_SUFFIX}", secret=False)
            secret_path = folder / f"{name}{SECRET_SUFFIX}"
            pair_public, secret = _read(secret_path, secret=True)
            assert secret is not None
            if pair_public != public or zmq.curve_public(secret) != public:
                raise ConfigError(
                    f"--curve: {secret_path} does not belong with {name}{PUBLIC_SUFFIX} (files "
                    f"of two key sets mixed?); copy the whole folder `{MAKE}` wrote"
                )
            keys[name] = (public, secret)
        return cls(
            folder=folder,
            server_public=keys[SERVER][0],
            server_secret=keys[SERVER][1],
            client_public=keys[CLIENT][0],
            client_secret=keys[CLIENT][1],
            allowed_clients=frozenset({keys[CLIENT][0]}),
        )

    def __repr__(self) -> str:
        return f"CurveKeys(folder={str(self.folder)!r})"

    __str__ = __repr__


__all__ = ["CurveKeys", "generate", "key_files", "require_curve"]
