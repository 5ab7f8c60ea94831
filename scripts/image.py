#!/usr/bin/env python3
"""Builds an OCI image archive of one of this repository's binaries, without a registry
or a container engine.

    scripts/image.py --binary target/release/ankusa-relay --ref ghcr.io/ankusa/relay:0.1.0 \
        --out target/images/relay.oci.tar

- The base layer comes from Debian's packages: those that ship the shared libraries the
  binary loads (found with ldd and dpkg -S), and ca-certificates, whose bundle is made
  here as update-ca-certificates would (every certificate, in sorted order). No shell, no
  package manager: the image holds the binary, its libraries, the certificates,
  /etc/passwd and /etc/group with the user 10001, and an empty /tmp.
- The second layer holds the binary (its debug sections stripped) as
  /usr/local/bin/NAME; the entrypoint is the binary, the user 10001:10001.
- The same inputs give the same digest: entries sorted, every mtime SOURCE_DATE_EPOCH (0
  by default), owners root or 10001 by number only, gzip without a name or a time.
- The archive is an OCI layout in a tar (skopeo's oci-archive). Its index names the image
  REF (io.containerd.image.name) and REF's tag (ref.name), so that
  `ctr -n k8s.io images import` registers it under the name the chart and the Relay use,
  and `skopeo copy oci-archive:FILE docker://REGISTRY/NAME:TAG` pushes it anywhere.

More than one program: `--program PATH` adds the Debian package that ships PATH and
those of the libraries it loads (e.g. an interpreter), `--package PKG` a package as it is,
`--file SRC=DEST` a file to the second layer, and `--entrypoint JSON` replaces the
binary as entrypoint (e2e/node.sh builds the previous release's image this way).

Prints the manifest's digest (sha256:...) on stdout.

`--rootfs DIR` writes the image's files into DIR instead (both layers, the same entries,
modes and owners), for the Containerfile's last stage to copy from its Debian build stage:
the same image through docker, podman or buildah.
"""
import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ankusa", "debs"
)
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
UID = 10001
# Package files an image never needs.
DROP = ("usr/share/doc/", "usr/share/man/", "usr/share/lintian/", "usr/share/locale/",
        "usr/share/info/", "usr/share/gdb/", "usr/share/bug/")


def log(msg):
    print(f"image: {msg}", file=sys.stderr)


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def libraries(binary):
    """The shared libraries `binary` loads, as resolved paths (the loader included)."""
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if r.returncode != 0 and "not a dynamic executable" in (r.stdout + r.stderr):
        return []
    out = r.stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            path = parts[parts.index("=>") + 1]
            if path.startswith("/"):
                libs.add(path)
        elif parts and parts[0].startswith("/"):
            libs.add(parts[0])
    return sorted(libs)


def owning_package(path):
    """The Debian package that ships `path` (trying its /usr and non-/usr spellings)."""
    candidates = [path, os.path.realpath(path)]
    for p in list(candidates):
        if p.startswith("/usr/"):
            candidates.append(p[4:])
        else:
            candidates.append("/usr" + p)
    for p in candidates:
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":", 1)[0].strip()
    raise SystemExit(f"image: no Debian package ships {path}")


def installed_version(pkg):
    return run("dpkg-query", "-W", "-f=${Version}", pkg).strip()


def fetch_deb(pkg):
    """The .deb of the installed version of `pkg` (or, when the archive no longer serves
    that version, of the version apt would install), from the cache or apt-get download."""
    version = installed_version(pkg)
    os.makedirs(CACHE, exist_ok=True)

    def cached(v):
        quoted = v.replace(":", "%3a")
        for name in sorted(os.listdir(CACHE)):
            if name.startswith(f"{pkg}_{quoted}_"):
                return os.path.join(CACHE, name)
        return None

    candidate = run("apt-cache", "policy", pkg).split("Candidate:", 1)[1].split()[0]
    for v in (version, candidate):
        if cached(v):
            return cached(v)
    log(f"downloading {pkg}={version}")
    r = subprocess.run(["apt-get", "download", f"{pkg}={version}"], cwd=CACHE,
                       capture_output=True, text=True)
    if r.returncode != 0 and candidate != version:
        log(f"{pkg}={version} is not served ({r.stderr.strip()}); downloading {candidate}")
        r = subprocess.run(["apt-get", "download", f"{pkg}={candidate}"], cwd=CACHE,
                           capture_output=True, text=True)
        version = candidate
    if r.returncode != 0 or not cached(version):
        raise SystemExit(f"image: apt-get download {pkg}={version} failed: {r.stderr.strip()}")
    return cached(version)


class Layer:
    """A tar layer built in memory: entries added in any order, written sorted."""

    def __init__(self):
        self.entries = {}  # path (no leading /) -> (TarInfo, bytes or None)

    def _info(self, path, kind, mode, uid=0):
        ti = tarfile.TarInfo(path)
        ti.type, ti.mode, ti.mtime = kind, mode, EPOCH
        ti.uid = ti.gid = uid
        ti.uname = ti.gname = ""
        return ti

    def dirs_of(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.entries:
                self.entries[d] = (self._info(d, tarfile.DIRTYPE, 0o755), None)

    def dir(self, path, mode=0o755, uid=0):
        self.dirs_of(path)
        self.entries[path] = (self._info(path, tarfile.DIRTYPE, mode, uid), None)

    def file(self, path, data, mode=0o644):
        self.dirs_of(path)
        ti = self._info(path, tarfile.REGTYPE, mode)
        ti.size = len(data)
        self.entries[path] = (ti, data)

    def symlink(self, path, target):
        self.dirs_of(path)
        ti = self._info(path, tarfile.SYMTYPE, 0o777)
        ti.linkname = target
        self.entries[path] = (ti, None)

    def tar(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for path in sorted(self.entries):
                ti, data = self.entries[path]
                t.addfile(ti, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def add_tree(layer, root):
    """Every file, directory and symlink under `root` (an unpacked package)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if any(rel.startswith(d) or (rel + "/") == d for d in DROP):
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                layer.symlink(rel, os.readlink(full))
            elif os.path.isdir(full):
                layer.dir(rel, st.st_mode & 0o7777)
            else:
                with open(full, "rb") as f:
                    layer.file(rel, f.read(), st.st_mode & 0o7777)


def base_layer(binaries, extra, tmp):
    packages = {"ca-certificates", *extra}
    for b in binaries:
        packages |= {owning_package(lib) for lib in libraries(b)}
    packages = sorted(packages)
    layer = Layer()
    for pkg in packages:
        deb = fetch_deb(pkg)
        dest = os.path.join(tmp, "pkg-" + pkg.replace(":", "_"))
        run("dpkg-deb", "-x", deb, dest)
        add_tree(layer, dest)
    # Debian's usrmerge: /bin, /lib, /lib64 and /sbin are links into /usr; packages still
    # ship files under them (the loader as /lib64/ld-linux-x86-64.so.2), moved here.
    for top in ("bin", "lib", "lib64", "sbin"):
        for k in [k for k in layer.entries if k == top or k.startswith(top + "/")]:
            ti, data = layer.entries.pop(k)
            if k == top:
                continue
            ti.name = "usr/" + k
            layer.dirs_of(ti.name)
            layer.entries[ti.name] = (ti, data)
        layer.symlink(top, f"usr/{top}")
    # The certificate bundle update-ca-certificates would make: every certificate of the
    # package, in sorted order.
    certs = sorted(k for k in layer.entries if k.startswith("usr/share/ca-certificates/") and k.endswith(".crt"))
    bundle = b"".join(layer.entries[c][1].rstrip(b"\n") + b"\n" for c in certs)
    layer.file("etc/ssl/certs/ca-certificates.crt", bundle)
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
               b"ankusa:x:10001:10001:ankusa:/nonexistent:/usr/sbin/nologin\n")
    layer.file("etc/group", b"root:x:0:\nankusa:x:10001:\n")
    layer.dir("tmp", 0o1777)
    return layer, packages


def app_layer(binary, name, files, tmp):
    stripped = os.path.join(tmp, name)
    run("objcopy", "--strip-debug", binary, stripped)
    layer = Layer()
    with open(stripped, "rb") as f:
        layer.file(f"usr/local/bin/{name}", f.read(), 0o755)
    for src, dest in files:
        with open(src, "rb") as f:
            mode = 0o755 if os.access(src, os.X_OK) else 0o644
            layer.file(dest.lstrip("/"), f.read(), mode)
    return layer


def blob(layout, data, media_type):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    with open(path, "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def gz(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as g:
        g.write(data)
    return buf.getvalue()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--ref", help="the image's reference, e.g. ghcr.io/ankusa/relay:0.1.0")
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="the .oci.tar to write (needs --ref)")
    out.add_argument("--rootfs", help="a directory to write the image's files into")
    ap.add_argument("--program", action="append", default=[],
                    help="a program of this machine whose package (and libraries) the base holds")
    ap.add_argument("--package", action="append", default=[], help="a Debian package the base holds")
    ap.add_argument("--file", action="append", default=[], metavar="SRC=DEST",
                    help="a file of this tree at DEST in the image")
    ap.add_argument("--entrypoint", help="the entrypoint, a JSON list (default: the binary)")
    a = ap.parse_args()
    files = []
    for f in a.file:
        src, sep, dest = f.partition("=")
        if not sep or not dest.startswith("/"):
            raise SystemExit(f"image: --file {f}: expected SRC=/DEST")
        files.append((src, dest))
    exe = os.path.basename(a.binary)
    if a.out and not a.ref:
        raise SystemExit("image: --out needs --ref")
    repo, _, tag = (a.ref or "").rpartition(":")
    if a.out and (not repo or "/" in tag):
        raise SystemExit(f"image: --ref {a.ref}: expected REGISTRY/NAME:TAG")
    created = datetime.datetime.fromtimestamp(EPOCH, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory() as tmp:
        programs = [os.path.realpath(p) for p in a.program]
        extra = set(a.package) | {owning_package(p) for p in programs}
        base, packages = base_layer([a.binary, *programs], extra, tmp)
        app = app_layer(a.binary, exe, files, tmp)
        if a.rootfs:
            for layer in (base, app):
                with tarfile.open(fileobj=io.BytesIO(layer.tar())) as t:
                    t.extractall(a.rootfs, numeric_owner=True)
            log(f"{a.rootfs}: the files of /usr/local/bin/{exe}'s image (base: {' '.join(packages)})")
            return
        entrypoint = json.loads(a.entrypoint) if a.entrypoint else [f"/usr/local/bin/{exe}"]
        layout = os.path.join(tmp, "layout")
        os.makedirs(os.path.join(layout, "blobs", "sha256"))
        layers, diff_ids = [], []
        for layer in (base, app):
            raw = layer.tar()
            diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
            layers.append(blob(layout, gz(raw), "application/vnd.oci.image.layer.v1.tar+gzip"))
        config = {
            "created": created,
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": f"{UID}:{UID}",
                "Entrypoint": entrypoint,
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin",
                        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
                "WorkingDir": "/",
                "Labels": {"org.opencontainers.image.title": repo,
                           "org.opencontainers.image.version": tag,
                           "dev.ankusa.base-packages": " ".join(packages)},
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [
                {"created": created, "created_by": "scripts/image.py: Debian packages " + " ".join(packages)},
                {"created": created, "created_by": f"scripts/image.py: /usr/local/bin/{exe}"
                 + "".join(f" {d}" for _, d in files)},
            ],
        }
        cfg = blob(layout, canonical(config), "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": cfg, "layers": layers}
        man = blob(layout, canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
        man["platform"] = {"architecture": "amd64", "os": "linux"}
        man["annotations"] = {"io.containerd.image.name": a.ref,
                              "org.opencontainers.image.ref.name": tag}
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [man]}
        with open(os.path.join(layout, "index.json"), "wb") as f:
            f.write(canonical(index))
        with open(os.path.join(layout, "oci-layout"), "wb") as f:
            f.write(canonical({"imageLayoutVersion": "1.0.0"}))
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        out = Layer()
        for dirpath, _, filenames in os.walk(layout):
            for fn in filenames:
                full = os.path.join(dirpath, fn)
                with open(full, "rb") as f:
                    out.file(os.path.relpath(full, layout), f.read())
        tmp_out = a.out + ".part"
        with open(tmp_out, "wb") as f:
            f.write(out.tar())
        os.replace(tmp_out, a.out)
        size = sum(l["size"] for l in layers)
        log(f"{a.out}: {a.ref} {man['digest']} ({size / 1e6:.1f} MB compressed; base: {' '.join(packages)})")
        print(man["digest"])


if __name__ == "__main__":
    main()
