"""Bundle safety and extraction (the check is pure: it runs over tar members before anything is written)."""

from __future__ import annotations

import tarfile

from .errors import SetupError, UnsafeBundle

MAX_SYMLINK_HOPS = 40


def _split_member_name(name: str) -> list[str]:
    """Normalised path components of a tar member name, refusing absolute paths and '..'."""
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeBundle(f"bundle member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeBundle(f"bundle member {name!r} contains '..'")
    return parts


def _resolve_virtual(parts: list[str], symlinks: dict[str, str], hops: list[int], what: str) -> list[str]:
    """Resolve `parts` (relative to the extraction root) through the archive's own symlinks.

    Raises UnsafeBundle as soon as any step leaves the root: a lexical check alone
    is not enough (`m -> .` then `l -> m/..` is lexically "." but really the parent).
    """
    out: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise UnsafeBundle(f"bundle {what} points outside the bundle")
            out.pop()
            continue
        out.append(part)
        target = symlinks.get("/".join(out))
        if target is None:
            continue
        hops[0] += 1
        if hops[0] > MAX_SYMLINK_HOPS:
            raise UnsafeBundle(f"bundle {what} goes through too many symlinks (a loop?)")
        if target.startswith("/"):
            raise UnsafeBundle(f"bundle {what} goes through a symlink to an absolute path {target!r}")
        out.pop()
        out = _resolve_virtual(out + target.split("/"), symlinks, hops, what)
    return out


def check_bundle_members(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """Check every member of a bundle; return the members to extract (without the root entry).

    Refuses: absolute names, '..' in names, symlinks whose target (followed through
    the archive's other symlinks) leaves the bundle, hardlinks to anything but a
    regular file of the bundle, device files and FIFOs, and duplicate names (a
    later duplicate could turn a checked directory into a link).
    """
    symlinks: dict[str, str] = {}
    names: dict[str, tarfile.TarInfo] = {}
    checked: list[tuple[list[str], tarfile.TarInfo]] = []
    for member in members:
        parts = _split_member_name(member.name)
        if not parts:
            if not member.isdir():
                raise UnsafeBundle(f"bundle member {member.name!r} has an empty name")
            continue  # "./": the root itself
        key = "/".join(parts)
        if key in names:
            raise UnsafeBundle(f"bundle member {key!r} appears twice")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeBundle(f"bundle member {key!r} is a device, FIFO or other special file")
        names[key] = member
        if member.issym():
            symlinks[key] = member.linkname
        checked.append((parts, member))

    regular_files = set()
    for parts, member in checked:
        if member.isreg():
            resolved = _resolve_virtual(parts[:-1], symlinks, [0], f"member {member.name!r}") + parts[-1:]
            regular_files.add("/".join(resolved))

    for parts, member in checked:
        what = f"member {member.name!r}"
        # Where the member itself lands: its directory is followed through symlinks.
        parent = _resolve_virtual(parts[:-1], symlinks, [0], what)
        if member.issym():
            if not member.linkname or member.linkname.startswith("/"):
                raise UnsafeBundle(f"bundle symlink {member.name!r} points to an absolute path {member.linkname!r}")
            _resolve_virtual(parent + member.linkname.split("/"), symlinks, [0], f"symlink {member.name!r}")
        elif member.islnk():
            link_parts = _split_member_name(member.linkname)
            resolved = _resolve_virtual(link_parts, symlinks, [0], f"hardlink {member.name!r}")
            if "/".join(resolved) not in regular_files:
                raise UnsafeBundle(
                    f"bundle hardlink {member.name!r} must point to a regular file of the bundle, not {member.linkname!r}"
                )
    return [member for _, member in checked]


def extract_bundle(tar_path: str, dest: str) -> int:
    """Check then extract a bundle into the empty directory `dest`; return the member count."""
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            members = check_bundle_members(tar.getmembers())
            for member in members:
                # No setuid/setgid/sticky, and keep the owner able to read, write and delete it.
                extra = 0o700 if member.isdir() else 0o600
                member.mode = (member.mode & 0o777) | extra
                member.uid = member.gid = 0
                member.uname = member.gname = ""
            kwargs = {}
            if hasattr(tarfile, "data_filter"):
                # Defence in depth where the interpreter has PEP 706 filters; our checks ran first.
                kwargs["filter"] = "data"
            tar.extractall(dest, members=members, numeric_owner=True, **kwargs)
            return len(members)
    except _TAR_FILTER_ERRORS as e:
        raise UnsafeBundle(f"bundle refused by the tar filter: {e}") from None
    except tarfile.TarError as e:
        raise SetupError(f"bundle is not a readable tar archive: {e}") from None


# PEP 706 filter errors subclass TarError but mean "unsafe", so they are caught first.
_TAR_FILTER_ERRORS = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()
