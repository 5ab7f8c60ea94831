"""A small W3C WebDriver client (standard library only) for Debian's chromium and
chromedriver: the console's browser test drives a real headless Chromium with it."""
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
TAB, ENTER, SHIFT = "\ue004", "\ue007", "\ue008"


class WebDriverError(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """A chromedriver process and one headless Chromium session; `close()` ends both."""

    def __init__(self, width=1280, height=800):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="ankusa-chromium-")
        self.driver = subprocess.Popen(
            ["/usr/bin/chromedriver", f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 20
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    break
            except (OSError, WebDriverError):
                pass
            if time.time() > deadline:
                self.driver.kill()
                raise WebDriverError("chromedriver did not start")
            time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-default-apps", "--hide-scrollbars",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                out = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise WebDriverError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None
        return out.get("value", out)

    def s(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self.s("POST", "/url", {"url": url})

    def url(self):
        return self.s("GET", "/url")

    def find(self, css):
        return self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def find_all(self, css):
        return [e[ELEMENT] for e in self.s("POST", "/elements", {"using": "css selector", "value": css})]

    def click(self, el):
        self.s("POST", f"/element/{el}/click", {})

    def type(self, el, text):
        self.s("POST", f"/element/{el}/value", {"text": text})

    def text(self, el):
        return self.s("GET", f"/element/{el}/text")

    def attr(self, el, name):
        return self.s("GET", f"/element/{el}/attribute/{name}")

    def page_text(self):
        return self.text(self.find("body"))

    def active(self):
        return self.s("GET", "/element/active")[ELEMENT]

    def keys(self, *keys):
        acts = []
        for k in keys:
            acts += [{"type": "keyDown", "value": k}, {"type": "keyUp", "value": k}]
        self.s("POST", "/actions", {"actions": [{"type": "key", "id": "keyboard", "actions": acts}]})
        self.s("DELETE", "/actions")

    def run(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def run_async(self, script, *args):
        return self.s("POST", "/execute/async", {"script": script, "args": list(args)})

    def size(self, width, height):
        self.s("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self, path):
        png = base64.b64decode(self.s("GET", "/screenshot"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)

    def wait_for(self, what, f, secs=20):
        deadline = time.time() + secs
        last = None
        while time.time() < deadline:
            try:
                if f():
                    return
            except WebDriverError as e:
                last = e
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} (last error: {last}); page: {self.url()}")

    def close(self):
        try:
            self.s("DELETE", "")
        except (OSError, WebDriverError):
            pass
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
