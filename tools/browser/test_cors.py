"""CORS in a real browser: a page served from another origin (python's http.server on
another port) calls `tessera serve --cors-origins ORIGIN --api-key KEY` with fetch and gets
a completion; from an origin the server does not list, the browser refuses the call.

Needs chromium and chromedriver, like test_chat_page.py (skipped without them).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target", "release", "tessera")
KEY = "secret"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs chromium and chromedriver (apt-get install -y chromium chromium-driver)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url, proc, what):
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(what + " exited")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise RuntimeError(what + " did not come up")
            time.sleep(0.2)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def pages():
    """Two static origins: the one the server allows and another."""
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "index.html"), "w") as f:
        f.write("<!doctype html><title>app</title><p>app</p>")
    procs, origins = [], []
    for _ in range(2):
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1", "--directory", d],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        origins.append(f"http://127.0.0.1:{port}")
        wait_up(origins[-1] + "/index.html", p, "http.server")
    yield origins
    for p in procs:
        stop(p)


@pytest.fixture(scope="module")
def server(pages):
    port = free_port()
    proc = subprocess.Popen(
        [BIN, "serve", "--port", str(port), "--served-model-name", "smol", "--api-key", KEY,
         "--cors-origins", pages[0], "--max-num-seqs", "4", "--max-model-len", "1024",
         "--kv-blocks", "256"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_up(base + "/health", proc, "tessera serve")
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--no-first-run", "--disable-extensions"]:
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_script_timeout(120)
    yield drv
    drv.quit()


CALL = """
const [base, key, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
fetch(base + '/v1/chat/completions', {
  method: 'POST',
  headers: {'content-type': 'application/json', 'authorization': 'Bearer ' + key,
            'x-api-key': key},
  body: JSON.stringify({model: 'smol', max_tokens: 4, temperature: 0,
                        messages: [{role: 'user', content: 'Hi'}]}),
}).then(r => r.json()).then(j => done({ok: true, body: j}),
        e => done({ok: false, error: String(e)}));
"""


def test_a_page_on_an_allowed_origin_gets_a_completion(server, pages, browser):
    browser.get(pages[0] + "/index.html")
    r = browser.execute_async_script(CALL, server, KEY)
    assert r["ok"], r
    assert r["body"]["object"] == "chat.completion", r
    assert r["body"]["choices"][0]["message"]["content"], r


def test_a_page_on_another_origin_is_refused_by_the_browser(server, pages, browser):
    browser.get(pages[1] + "/index.html")
    r = browser.execute_async_script(CALL, server, KEY)
    assert not r["ok"], r
