#!/usr/bin/env python3
"""Opens report pages (`logitctl validate|verify --report=DIR`) in headless Chromium.

    usage: scripts/check-report-browser.py [--chromium PATH] [--screenshots DIR] PAGE...

Each page is loaded from its file in a real browser (Playwright for Python driving
the system's Chromium, Debian's `chromium` package by default): no console error or
page error, no request leaving the file, every inline SVG plot laid out with a
non-empty box, the verdict heading visible, the page no wider than a 1400 px
window, and on a verify page the precision-class test's figure. A full-page screenshot of each is
kept under --screenshots (a CI artefact). Exit 1 on any problem, 2 when the
browser or Playwright is missing.
"""
import argparse
import os
import pathlib
import shutil
import sys

# The window a report is read in (and must fit).
WIDTH = 1400


def check(page, path, screenshots):
    problems, console = [], []
    page.on("console", lambda m: console.append(m) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "about:"))
            else problems.append(f"request to {r.url}"))
    url = pathlib.Path(path).resolve().as_uri()
    page.goto(url, wait_until="load")
    for m in console:
        problems.append(f"console error: {m.text}")
    heading = page.locator("h1").first
    if not heading.is_visible():
        problems.append("the verdict heading is not visible")
    verdict = heading.inner_text().strip() if heading.count() else ""
    if not any(word in verdict for word in ("PASSED", "FAILED", "ERROR")):
        problems.append(f"the heading names no verdict: {verdict!r}")
    plots = page.locator("svg")
    boxes = []
    for i in range(plots.count()):
        box = plots.nth(i).bounding_box()
        title = plots.nth(i).locator("title").first
        name = title.text_content() if title.count() else f"plot {i}"
        if not box or box["width"] < 10 or box["height"] < 10:
            problems.append(f"plot '{name}' has an empty box ({box})")
        else:
            boxes.append(f"{name}: {box['width']:.0f}x{box['height']:.0f}")
    # The page fits the width it is read at: no table or plot past it.
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > WIDTH:
        problems.append(f"the page is {width} px wide, past the {WIDTH} px window")
    # A verify page shows what decided each candidate: the precision-class
    # test's figure beside the proven bound's histogram.
    if page.locator("h2", has_text="verify: candidates against the contract").count():
        titles = [plots.nth(i).locator("title").first.text_content() or ""
                  for i in range(plots.count()) if plots.nth(i).locator("title").count()]
        if not any("the precision-class test" in t for t in titles):
            problems.append("a verify page without the precision-class test's figure")
    if screenshots:
        os.makedirs(screenshots, exist_ok=True)
        stem = pathlib.Path(path).resolve().parent.name or "report"
        page.screenshot(path=os.path.join(screenshots, f"{stem}.png"), full_page=True)
    print(f"{path}: '{verdict}', {len(boxes)} plots laid out")
    for b in boxes:
        print(f"  {b}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium")
                   or "/usr/bin/chromium")
    p.add_argument("--screenshots")
    p.add_argument("pages", nargs="+")
    args = p.parse_args()
    if not os.path.exists(args.chromium):
        print(f"check-report-browser: no Chromium at {args.chromium} (apt-get install chromium)")
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("check-report-browser: Playwright is missing (pip install playwright)")
        return 2
    bad = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium,
                                     args=["--no-sandbox", "--disable-gpu"])
        for path in args.pages:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            problems = check(page, path, args.screenshots)
            page.close()
            for q in problems:
                print(f"  PROBLEM: {q}")
            bad += bool(problems)
        browser.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
