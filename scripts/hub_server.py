#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub, for tests: no network, standard library only.

usage: hub_server.py ROOT --port-file F [--log F] [--mode-file F]

ROOT/ORG/NAME/ holds the files of one revision of the repo ORG/NAME (any nesting). Its
commit is the sha1 of "ORG/NAME" (or the content of ROOT/ORG/NAME/.commit); the
revisions "main" and the commit resolve to it, every other one is 404. A file
ROOT/ORG/NAME/.token makes the repo gated: requests need "Authorization: Bearer <its
content>" (401 without a token, 403 with a wrong one).

It answers as the hub does:
  GET  /api/models/ORG/NAME/revision/REV[?blobs=true]  {"id", "sha", "siblings": [...]}
       (with blobs=true each sibling has "size", "blobId" and for LFS files "lfs")
  GET|HEAD /ORG/NAME/resolve/REV/PATH   LFS files (*.safetensors, *.gguf, *.bin): 302 to
       /cdn/SHA256 with X-Linked-Etag (the sha256) and X-Linked-Size; other files: 200
       with ETag = the git blob sha1
  GET|HEAD /cdn/SHA256                  the bytes, with Range (206)
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).

The mode file (read on every request) changes how file bytes are sent:
  normal   as they are
  cut      the connection drops at the middle of each LFS file (a resumed request
           that starts past the middle gets nothing either)
  corrupt  one byte of each file flipped
  slow     ~30 ms per 64 KiB, so that concurrent clients overlap
  noblobs  the API ignores blobs=true (sizes and hashes come from each file's headers)
  cdnhost  LFS redirects go to http://localhost:PORT/cdn/... (another host name, as the
           hub's CDN is: a client must not send it the token)
The log gets one line per request: METHOD PATH range=R auth=yes|no -> STATUS BYTES.
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")
CHUNK = 64 * 1024


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, root, repo_id):
        self.id = repo_id
        self.dir = os.path.join(root, *repo_id.split("/"))
        commit_file = os.path.join(self.dir, ".commit")
        if os.path.exists(commit_file):
            self.commit = open(commit_file).read().strip()
        else:
            self.commit = hashlib.sha1(repo_id.encode()).hexdigest()
        token_file = os.path.join(self.dir, ".token")
        self.token = open(token_file).read().strip() if os.path.exists(token_file) else None

    def files(self):
        out = []
        for base, dirs, names in os.walk(self.dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if n.startswith("."):
                    continue
                out.append(os.path.relpath(os.path.join(base, n), self.dir).replace(os.sep, "/"))
        return out

    def read(self, path):
        full = os.path.join(self.dir, *path.split("/"))
        if ".." in path.split("/") or not os.path.isfile(full):
            return None
        with open(full, "rb") as f:
            return f.read()


def describe(data, path):
    """The sibling entry of a file, as the hub's API gives it with blobs=true."""
    entry = {"rfilename": path, "size": len(data)}
    if path.endswith(LFS_SUFFIXES):
        sha = hashlib.sha256(data).hexdigest()
        pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha, len(data))).encode()
        entry["blobId"] = git_blob_sha1(pointer)
        entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
    else:
        entry["blobId"] = git_blob_sha1(data)
    return entry


class Handler(BaseHTTPRequestHandler):
    server_version = "hub-stand-in/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the log file replaces stderr chatter
        pass

    def log_line(self, status, sent):
        cfg = self.server.cfg
        if cfg.log:
            line = "%s %s range=%s auth=%s -> %d %d\n" % (
                self.command, self.path, self.headers.get("Range", "-"),
                "yes" if self.headers.get("Authorization") else "no", status, sent)
            with cfg.lock, open(cfg.log, "a") as f:
                f.write(line)

    def mode(self):
        try:
            with open(self.server.cfg.mode_file) as f:
                return f.read().strip() or "normal"
        except (OSError, TypeError):
            return "normal"

    def reply(self, status, body=b"", headers=None, error_code=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.log_line(status, 0 if self.command == "HEAD" else len(body))

    def error(self, status, code, message):
        body = json.dumps({"error": message}).encode()
        self.reply(status, body, {"Content-Type": "application/json"}, code)

    def check_repo(self, org, name, rev):
        """The repo, or None after answering with the error."""
        root = self.server.cfg.root
        if not os.path.isdir(os.path.join(root, org, name)) or org.startswith(".") or name.startswith("."):
            self.error(404, "RepoNotFound", "Repository not found")
            return None
        repo = Repo(root, org + "/" + name)
        if repo.token:
            auth = self.headers.get("Authorization", "")
            if not auth:
                self.error(401, "GatedRepo", "Access to model %s is restricted. You must be authenticated." % repo.id)
                return None
            if auth != "Bearer " + repo.token:
                self.error(403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized list." % repo.id)
                return None
        if rev not in ("main", repo.commit):
            self.error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
            return None
        return repo

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client went away: its business
            pass

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        try:
            if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "revision":
                blobs = "blobs=true" in url.query and self.mode() != "noblobs"
                return self.api_revision(parts[2], parts[3], parts[5], blobs)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(parts[0], parts[1], parts[3], "/".join(parts[4:]))
            if len(parts) == 2 and parts[0] == "cdn":
                return self.cdn(parts[1])
            self.error(404, None, "not found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def api_revision(self, org, name, rev, blobs):
        repo = self.check_repo(org, name, rev)
        if not repo:
            return
        siblings = []
        for path in repo.files():
            siblings.append(describe(repo.read(path), path) if blobs else {"rfilename": path})
        body = json.dumps({"id": repo.id, "modelId": repo.id, "sha": repo.commit, "siblings": siblings}).encode()
        self.reply(200, body, {"Content-Type": "application/json"})

    def resolve(self, org, name, rev, path):
        repo = self.check_repo(org, name, rev)
        if not repo:
            return
        data = repo.read(path)
        if data is None:
            return self.error(404, "EntryNotFound", "%s does not exist on %s" % (path, rev))
        entry = describe(data, path)
        common = {"X-Repo-Commit": repo.commit}
        if "lfs" in entry:
            sha = entry["lfs"]["sha256"]
            self.server.cfg.blobs[sha] = data
            location = "/cdn/%s" % sha
            if self.mode() == "cdnhost":
                location = "http://localhost:%d%s" % (self.server.server_address[1], location)
            common.update({"Location": location, "X-Linked-Etag": '"%s"' % sha,
                           "X-Linked-Size": str(len(data)), "ETag": '"%s"' % entry["blobId"]})
            return self.reply(302, b"", common)
        common["ETag"] = '"%s"' % entry["blobId"]
        self.send_file(data, common, lfs=False)

    def cdn(self, sha):
        data = self.server.cfg.blobs.get(sha)
        if data is None:
            return self.error(404, None, "no such blob")
        self.send_file(data, {"ETag": '"%s"' % sha}, lfs=True)

    def send_file(self, data, headers, lfs):
        mode = self.mode()
        if mode == "corrupt" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else 0
            end = int(b) + 1 if b else len(data)
            if start >= len(data):
                return self.reply(416, b"", {"Content-Range": "bytes */%d" % len(data)})
            status = 206
            headers = dict(headers, **{"Content-Range": "bytes %d-%d/%d" % (start, end - 1, len(data))})
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command == "HEAD":
            return self.log_line(status, 0)
        stop = end
        if mode == "cut" and lfs:
            stop = min(end, max(start, len(data) // 2))
        sent = 0
        for off in range(start, stop, CHUNK):
            self.wfile.write(data[off:min(off + CHUNK, stop)])
            sent += min(off + CHUNK, stop) - off
            if mode == "slow":
                time.sleep(0.03)
        self.log_line(status, sent)
        if stop < end:  # drop the connection midway
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Config:
    def __init__(self, args):
        self.root = os.path.abspath(args.root)
        self.log = args.log
        self.mode_file = args.mode_file
        self.lock = threading.Lock()
        self.blobs = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--port-file", required=True, help="written with the port once listening")
    ap.add_argument("--log")
    ap.add_argument("--mode-file")
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.cfg = Config(args)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
