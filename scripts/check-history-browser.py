#!/ usr / bin / env python3
"""The history's pages in headless Chromium, over real recorded runs.

    usage: scripts/check-history-browser.py --logitd BIN [--chromium PATH] [--screenshots DIR]

Starts logitd (cpu backend, a fresh --history file, the metrics port, bearer
tokens for two tenants), records 120 Verify runs of two cases of one project
through the Python client (main and dev branches, a rule that one changed
candidate breaks, a case whose name is markup), and opens /history, the
project's, each case's and a run's page in a real browser (Playwright for
Python driving the system's Chromium) with the first tenant's token: each
answers 200 with no console or page error, no request leaving the server, no
script on the page (the markup name is shown as text), every plot laid out,
the page no wider than 1400 px, and the figures it should show. Then what a
page must refuse: no token (401), the other tenant (its own empty history;
the first tenant's case is 404 to it), an unknown page (404). Full-page
screenshots are kept under --screenshots. Exit 1 on any problem, 2 when the
browser, Playwright or the client is missing.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

WIDTH = 1400
RUNS = 120
MARKUP_CASE = "<script>alert('case')</script> & co"


def start_server(logitd, work):
    tokens = work / "tokens"
    tokens.write_text("tok-a team-a\ntok-b team-b\n")
    args = [logitd, "--backend=cpu", "--address=127.0.0.1:0", "--port_file=%s" % (work / "port"),
            "--metrics_address=127.0.0.1:0", "--metrics_port_file=%s" % (work / "mport"),
            "--history=%s" % (work / "h.sqlite3"), "--auth_tokens=%s" % tokens]
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if (work / "port").exists() and (work / "mport").exists():
            port, mport = (work / "port").read_text().strip(), (work / "mport").read_text().strip()
            if port and mport:
                return proc, "127.0.0.1:" + port, "http://127.0.0.1:" + mport
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("logitd did not start: " + (work / "server.log").read_text())


def record_runs(logitd_mod, np, server):
    """RUNS runs of two cases; returns the id of a run with an alert."""
    rng = np.random.default_rng(5)
    import ml_dtypes
    with logitd_mod.Client(server, token="tok-a", timeout=120) as c:
        w = rng.standard_normal((96, 64)).astype(ml_dtypes.bfloat16)
        info = c.register_weights(w, name="pages")
        x = rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
        y = c.logits(x, info)
        c.set_rules("lm-head", [logitd_mod.Rule(bits_unchanged=True, branch="main")])
        alerted = 0
        for i in range(RUNS):
            case = "logits-8x96" if i % 4 else MARKUP_CASE
            branch = "dev" if i % 3 == 0 else "main"
            cand = y
            if i % 17 == 5:  # a changed candidate: within bounds, but other bits
                cand = y.copy()
                cand[0, 0] = np.nextafter(cand[0, 0], np.float32(np.inf), dtype=np.float32)
            compare = logitd_mod.Baseline(branch="main") if i >= 8 else None
            v = c.verify_logits(x, cand, info, record=logitd_mod.RunLabels("lm-head", case, branch, "r%03d" % i),
                                compare=compare)
            if v.alerts:
                alerted = v.run_id
        if not alerted:
            raise RuntimeError("no run broke the rule: the alert pages cannot be checked")
        return alerted


def get(url, token=None):
    req = urllib.request.Request(url, headers={
  "Authorization" : "Bearer " + token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def check_page(page, url, name, expect_plots, expect_text, screenshots):
    problems, console = [], []
    page.on("console", lambda m: console.append(m) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    base = url.split("/history")[0]
    page.on("request", lambda r: None if r.url.startswith(base) else problems.append(f"request to {r.url}"))
    response = page.goto(url, wait_until="load")
    if response is None or response.status != 200:
        return [f"status {response.status if response else None}"]
    for m in console:
        problems.append(f"console error: {m.text}")
    if page.locator("script").count():
        problems.append("a <script> element on the page (a name was not escaped)")
    plots = page.locator("svg")
    if plots.count() != expect_plots:
        problems.append(f"{plots.count()} plots, expected {expect_plots}")
    for i in range(plots.count()):
        box = plots.nth(i).bounding_box()
        if not box or box["width"] < 10 or box["height"] < 10:
            problems.append(f"plot {i} has an empty box ({box})")
    text = page.locator("body").inner_text()
    for want in expect_text:
        if want not in text:
            problems.append(f"the page does not show {want!r}")
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > WIDTH:
        problems.append(f"the page is {width} px wide, past the {WIDTH} px window")
    if screenshots:
        page.screenshot(path=os.path.join(screenshots, f"history-{name}.png"), full_page=True)
    print(f"{name}: {url.split('/history', 1)[1] or '/'}: {plots.count()} plots")
    return problems


def refusals(http):
    """What the pages must refuse, checked over plain HTTP."""
    problems = []
    checks = [
        (get(http + "/history"), 401, "requires a bearer token"),
        (get(http + "/history", "tok-x"), 401, "not known to this server"),
        (get(http + "/history", "tok-b"), 200, "No recorded runs yet"),
        (get(http + "/history/project?project=lm-head", "tok-b"), 404, "no recorded runs of project"),
        (get(http + "/history/nope", "tok-a"), 404, "no page at /history/nope"),
        (get(http + "/history/run?run=x", "tok-a"), 400, "run: expected a run"),
    ]
    for (status, body), want_status, want_text in checks:
        if status != want_status or want_text not in body:
            problems.append(f"expected {want_status} with {want_text!r}, got {status}: {body[:200]!r}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--logitd", required=True)
    p.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium")
                   or "/usr/bin/chromium")
    p.add_argument("--screenshots")
    args = p.parse_args()
    if not os.path.exists(args.chromium):
        print(f"check-history-browser: no Chromium at {args.chromium}")
        return 2
    try:
        import numpy as np
        from playwright.sync_api import sync_playwright

        import logitd as logitd_mod
    except ImportError as e:
        print(f"check-history-browser: {e} (pip install playwright numpy ml_dtypes, and ./client/python)")
        return 2
    if args.screenshots:
        os.makedirs(args.screenshots, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp())
    proc, server, http = start_server(args.logitd, work)
    problems = []
    try:
        alerted = record_runs(logitd_mod, np, server)
        problems += refusals(http)
        quoted = urllib.parse.quote(MARKUP_CASE, safe="")
        pages = [
            ("projects", "/history", 0, ["lm-head", str(RUNS)]),
            ("project", "/history/project?project=lm-head", 0, ["logits-8x96", MARKUP_CASE, "bits_unchanged branch=main"]),
            ("case", "/history/case?project=lm-head&case=logits-8x96", 4,
             ["worst bound fraction", "r119", "cpu"]),
            ("case-markup", f"/history/case?project=lm-head&case={quoted}", 4, [MARKUP_CASE]),
            ("case-main", "/history/case?project=lm-head&case=logits-8x96&branch=main", 4, ["of branch main"]),
            ("run-alert", f"/history/run?run={alerted}", 0, ["bits_unchanged branch=main", "bits changed against run"]),
        ]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(viewport={"width": WIDTH, "height": 900},
                                          extra_http_headers={"Authorization": "Bearer tok-a"})
            for name, path, plots, texts in pages:
                page = context.new_page()
                for q in check_page(page, http + path, name, plots, texts, args.screenshots):
                    problems.append(f"{name}: {q}")
                page.close()
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    for q in problems:
        print(f"  PROBLEM: {q}")
    print(f"check-history-browser: {len(problems)} problem(s) over {RUNS} recorded runs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
