"""A stand-in for the Hugging Face hub on 127.0.0.1: serves files of one dataset repository."""
import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubStandIn:
    """Serve `files` (name -> bytes) as /datasets/<repo_id>/resolve/main/<name>; count GETs."""

    def __init__(self, repo_id, files):
        self.repo_id, self.files, self.gets = repo_id, files, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _respond(self, with_body):
                prefix = f"/datasets/{hub.repo_id}/resolve/main/"
                name = self.path.split("?")[0][len(prefix):]
                if not self.path.startswith(prefix) or name not in hub.files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = hub.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", '"' + hashlib.sha1(body).hexdigest() + '"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.end_headers()
                if with_body:
                    hub.gets.append(name)
                    self.wfile.write(body)

            def do_HEAD(self):
                self._respond(with_body=False)

            def do_GET(self):
                self._respond(with_body=True)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
