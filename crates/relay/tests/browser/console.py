"""The console in a real headless Chromium against a live node (started by
crates/relay/tests/it/console.rs, which passes what it set up in the environment).

Each step asserts what a user would see; a screenshot of every page goes to $SHOTS."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webdriver import Browser, TAB, ENTER  # noqa: E402

ADMIN = os.environ["ADMIN_URL"]
TOKEN = os.environ["ADMIN_TOKEN"]
FLAKY = os.environ["HOOK_FLAKY"]
DELIVERY = os.environ["DELIVERY_FLAKY"]
DEAD = os.environ["HOOK_DEAD"]
SHOTS = os.environ["SHOTS"]


def api(method, path, body=None):
    req = urllib.request.Request(ADMIN + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {TOKEN}",
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def fetch_status(b, url, method="GET", body=None):
    """The status a same-origin fetch from the page gets (the session cookie goes along)."""
    return b.run_async(
        "const [u, m, body, done] = arguments;"
        "fetch(u, {method: m, body: body, redirect: 'manual', credentials: 'same-origin',"
        " headers: body ? {'content-type': 'application/x-www-form-urlencoded'} : {}})"
        ".then(r => done(r.status), e => done(String(e)));",
        url, method, body)


def shot(b, name):
    b.screenshot(os.path.join(SHOTS, f"{name}.png"))


def labelled(b):
    """Every visible form control has a label (or an aria-label)."""
    missing = b.run(
        "return [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]"
        ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))"
        ".map(e => e.outerHTML);")
    assert not missing, f"controls without a label: {missing}"


def main():
    b = Browser(1280, 800)
    try:
        # Sign in.
        b.get(ADMIN + "/ui/")
        b.wait_for("the sign-in page", lambda: b.url().endswith("/ui/login"))
        labelled(b)
        shot(b, "login")
        b.type(b.find("#token"), "not-a-token")
        b.click(b.find("button[type=submit]"))
        b.wait_for("the refusal", lambda: "not valid" in b.page_text())
        b.type(b.find("#token"), TOKEN)
        b.click(b.find("button[type=submit]"))
        b.wait_for("the overview", lambda: b.find("h1") and b.text(b.find("h1")) == "Overview")
        assert "Ingest" in b.page_text() and "Backlog" in b.page_text()
        newest = b.run("return document.getElementById('h-newest').parentElement.textContent;")
        assert FLAKY in newest and "acme" in newest, newest
        cookie = b.s("GET", "/cookie/ankusa_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        shot(b, "overview")

        # A hook by its id: three attempts, the third delivered.
        b.get(ADMIN + "/ui/hooks")
        labelled(b)
        shot(b, "find-hook")
        b.type(b.find("#id"), FLAKY)
        b.keys(ENTER)
        b.wait_for("the hook page", lambda: FLAKY in b.text(b.find("h1")))
        text = b.page_text()
        assert "3 attempts" in text, text
        rows = b.run("return [...document.querySelectorAll('section.sink tbody tr')]"
                     ".filter(r => r.cells[1].textContent === 'attempt').length;")
        assert rows == 3, rows
        assert "delivered" in text and "503" in text, text
        shot(b, "hook")

        # The same hook by the provider's delivery id.
        b.get(ADMIN + "/ui/hooks")
        b.type(b.find("#tenant"), "acme")
        b.type(b.find("#delivery"), DELIVERY)
        b.click(b.find("form:nth-of-type(2) button[type=submit]"))
        b.wait_for("the hook by delivery id", lambda: FLAKY in b.text(b.find("h1")))
        assert "3 attempts" in b.page_text()

        # Every other page renders, labelled, and gets its screenshot.
        for path, name, expect in [
            ("/ui/tenants", "tenants", "acme"),
            ("/ui/tenants?view=busiest", "tenants-busiest", "the most pending first"),
            ("/ui/tenants?q=ac", "tenants-search", "acme"),
            ("/ui/tenants/acme", "tenant", "Tenant acme"),
            ("/ui/dlq?tenant=acme", "dlq", DEAD),
            ("/ui/sinks", "sinks", "strict"),
            ("/ui/archive?tenant=acme", "archive", "Archive of acme"),
            ("/ui/audit", "audit", "Audit trail"),
            ("/ui/quarantine", "quarantine", "Quarantine"),
        ]:
            b.get(ADMIN + path)
            b.wait_for(path, lambda: expect in b.page_text())
            labelled(b)
            shot(b, name)

        # A POST without the CSRF token changes nothing: 403.
        b.get(ADMIN + "/ui/dlq?tenant=acme")
        status = fetch_status(b, "/ui/dlq/replay", "POST", "tenant=acme&confirm=yes")
        assert status == 403, status
        status = fetch_status(b, "/ui/dlq/replay", "POST", "tenant=acme&confirm=yes&csrf=forged")
        assert status == 403, status
        assert api("GET", "/v1/tenants/acme")["counters"]["dead"] == 1

        # Keyboard only: Tab to the dead hook's Replay button, Enter, confirm with Enter.
        b.get(ADMIN + "/ui/dlq?tenant=acme")
        b.run("document.activeElement && document.activeElement.blur(); window.focus();")
        target = None
        for _ in range(80):
            b.keys(TAB)
            label = b.attr(b.active(), "aria-label") or ""
            if DEAD in label and label.startswith("Replay"):
                target = label
                break
        assert target, "Tab never reached the Replay button"
        b.keys(ENTER)
        b.wait_for("the confirmation", lambda: "Replay dead letters?" in b.page_text())
        assert "1 dead row will move" in b.page_text(), b.page_text()
        shot(b, "replay-confirm")
        # The confirm button has the focus: Enter replays.
        assert (b.text(b.active()) or "").startswith("Replay 1 row"), b.text(b.active())
        b.keys(ENTER)
        b.wait_for("the replay's result", lambda: "moved back to the queue" in b.page_text())
        # The replayed hook is delivered.
        b.get(ADMIN + f"/ui/hooks/{DEAD}")

        def delivered():
            b.get(ADMIN + f"/ui/hooks/{DEAD}")
            return "delivered" in b.text(b.find("section.sink h2"))
        b.wait_for("the replayed hook delivered", delivered)
        shot(b, "hook-replayed")

        # The tenant portal: its tenant, and another tenant is 404. It shows the tenant's own
        # endpoints, never their secrets.
        made = api("POST", "/v1/tenants/acme/endpoints",
                   {"url": "https://hooks.acme.example/in", "description": "acme billing",
                    "filter": {"event": "invoice.*"}})
        link = api("POST", "/v1/portal-links", {"tenant": "acme", "ttl_ms": 600000})
        b.get(ADMIN + link["path"])
        b.wait_for("the portal", lambda: "Tenant acme" in b.page_text())
        assert "Portal of acme" in b.page_text()
        endpoints = b.text(b.find("section[aria-labelledby='h-ep']"))
        for shown in [made["endpoint"]["id"], "https://hooks.acme.example/in", "acme billing", "invoice.*"]:
            assert shown in endpoints, f"{shown} not on the portal's endpoints: {endpoints}"
        source = b.run("return document.documentElement.outerHTML;")
        assert made["secret"] not in source and "whsec_" not in source, "a secret on the page"
        assert "Overview" not in b.text(b.find("nav")), "the portal shows no relay-wide pages"
        shot(b, "portal")
        prefix = link["path"].rstrip("/")
        assert fetch_status(b, prefix + "/tenants/globex") == 404
        assert fetch_status(b, prefix + "/tenants/acme") == 200
        b.get(ADMIN + prefix + "/tenants/globex")
        assert "Not found" in b.page_text()
        assert fetch_status(b, prefix.replace("/p1.", "/p1.x") + "/") == 404

        # Phone width: nothing but tables scrolls sideways.
        b.size(390, 844)
        for path, name in [("/ui/tenants/acme", "tenant-phone"), (f"/ui/hooks/{FLAKY}", "hook-phone")]:
            b.get(ADMIN + path)
            wide = b.run("return document.documentElement.scrollWidth - window.innerWidth;")
            assert wide <= 1, f"{path} is {wide}px wider than the phone's screen"
            shot(b, name)
        print("console browser test: every step passed; screenshots in", SHOTS)
    finally:
        b.close()


if __name__ == "__main__":
    main()
