"""The chat page at `/` of `tessera serve`, driven in headless Chromium through WebDriver.

Run with `scripts/test` (it skips this when chromium or chromedriver is missing), or:
build `target/release/tessera`, install `apt-get install -y chromium chromium-driver` and
`pip install -r tools/browser/requirements.txt`, then `python -m pytest tools/browser`.
Starts its own server (API key `secret`, the `pirate` test adapter) on a free loopback port
and stops it afterwards. CHROMIUM and CHROMEDRIVER override the binaries' paths.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

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


def api(base, path, body=None):
    req = urllib.request.Request(
        base + path, data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read()) if path != "/metrics" else r.read().decode()


def metric(base, name):
    for line in api(base, "/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


@pytest.fixture(scope="module")
def server():
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [BIN, "serve", "--port", str(port), "--served-model-name", "smol", "--api-key", KEY,
         "--lora", "pirate=" + os.path.join(ROOT, "tests", "golden", "lora", "pirate"),
         "--max-num-seqs", "4", "--max-model-len", "1024", "--kv-blocks", "256"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError("tessera serve exited: " + log.read().decode(errors="replace"))
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise RuntimeError("server did not come up")
            time.sleep(0.2)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1000,900", "--no-first-run", "--disable-extensions"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_script_timeout(30)
    yield drv
    drv.quit()


def wait(drv, cond, timeout=60):
    return WebDriverWait(drv, timeout, poll_frequency=0.05).until(cond)


def set_value(drv, elem_id, value):
    el = drv.find_element(By.ID, elem_id)
    el.clear()
    if value != "":
        el.send_keys(str(value))


def watch_replies(drv):
    """Records every text length the last assistant reply goes through (MutationObserver)."""
    drv.execute_script("""
        window.__lengths = [];
        const log = document.getElementById('log');
        new MutationObserver(() => {
          const r = log.querySelector('li.assistant:last-child .content');
          if (r) window.__lengths.push(r.textContent.length);
        }).observe(log, {childList: true, subtree: true, characterData: true});
    """)


def last_reply(drv):
    return drv.find_elements(By.CSS_SELECTOR, "#log li.assistant")[-1]


def send(drv, text):
    box = drv.find_element(By.ID, "input")
    box.send_keys(text)
    drv.find_element(By.ID, "send").click()


def test_chat_page(server, browser):
    drv = browser
    drv.get(server + "/")
    assert drv.title == "Tessera chat"

    # Without the key the model list gets 401, shown in the alert.
    err = wait(drv, EC.visibility_of_element_located((By.ID, "error")))
    assert "401" in err.text and "API key" in err.text, err.text

    # Entering the key (stored in the page) loads the model list: base model and adapter.
    set_value(drv, "apikey", KEY + Keys.TAB)  # leaving the field: the change event
    wait(drv, lambda d: d.find_element(By.ID, "model").get_attribute("data-loaded") == "true")
    ids = [m["id"] for m in api(server, "/v1/models")["data"]]
    options = [o.get_attribute("value")
               for o in drv.find_elements(By.CSS_SELECTOR, "#model option")]
    assert options == ids == ["smol", "pirate"]
    assert not drv.find_element(By.ID, "error").is_displayed()
    assert drv.execute_script("return localStorage.getItem('tessera.apiKey')") == KEY

    # Talk to the adapter, greedy, a fixed length.
    drv.find_element(By.CSS_SELECTOR, "#model option[value='pirate']").click()
    drv.find_element(By.CSS_SELECTOR, "#settings summary").click()
    set_value(drv, "temperature", 0)
    set_value(drv, "max_tokens", 24)
    watch_replies(drv)
    question = "What is the capital of France?"
    send(drv, question)
    reply = wait(drv, lambda d: (r := last_reply(d)).get_attribute("data-done") == "true" and r)
    text = reply.find_element(By.CLASS_NAME, "content").get_attribute("textContent")
    meta = reply.find_element(By.CLASS_NAME, "meta").text
    lengths = drv.execute_script("return window.__lengths")

    # It streamed: the text went through at least two distinct non-empty lengths.
    assert len({n for n in lengths if 0 < n < len(text)}) >= 2, lengths
    # ...and ended as what the same request gives without streaming.
    same = api(server, "/v1/chat/completions", {
        "model": "pirate", "messages": [{"role": "user", "content": question}],
        "temperature": 0, "top_p": 1, "max_tokens": 24})
    assert text == same["choices"][0]["message"]["content"] != ""
    # Tokens/s from the usage chunk: 24 tokens, a rate, the finish reason.
    assert re.search(r"^24 tokens · first token \d+ ms · \d+\.\d tok/s · finish: length$", meta), meta
    assert not drv.find_element(By.ID, "error").is_displayed()

    # A second turn carries the first as history.
    set_value(drv, "max_tokens", 8)
    send(drv, "And of Italy?")
    reply2 = wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log li.assistant")) == 2
                  and (r := last_reply(d)).get_attribute("data-done") == "true" and r)
    second = api(server, "/v1/chat/completions", {
        "model": "pirate", "temperature": 0, "top_p": 1, "max_tokens": 8,
        "messages": [{"role": "user", "content": question},
                     {"role": "assistant", "content": text},
                     {"role": "user", "content": "And of Italy?"}]})
    assert reply2.find_element(By.CLASS_NAME, "content").get_attribute("textContent") == \
        second["choices"][0]["message"]["content"]

    # Stop aborts the stream; the server cancels the request.
    set_value(drv, "max_tokens", 400)
    send(drv, "Tell me a long story about a ship.")
    wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log li.assistant")) == 3 and
         len(last_reply(d).find_element(By.CLASS_NAME, "content").get_attribute("textContent")) > 0)
    drv.find_element(By.ID, "stopbtn").click()
    stopped = wait(drv, lambda d: (r := last_reply(d)).get_attribute("data-done") == "true" and r)
    assert "stopped" in stopped.get_attribute("class")
    assert stopped.find_element(By.CLASS_NAME, "meta").text.endswith("stopped")
    assert not drv.find_element(By.ID, "stopbtn").is_enabled()
    for _ in range(200):
        if metric(server, "tessera_requests_running") == 0 and metric(server, "tessera_kv_blocks_used") == 0:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the stopped request still runs")

    # An invalid setting gets the server's 400 shown, and the message back in the box.
    drv.execute_script("document.getElementById('stop').value = Array(17).fill('x').join('\\n')")
    send(drv, "Hello")
    err = wait(drv, EC.visibility_of_element_located((By.ID, "error")))
    assert "HTTP 400" in err.text and "stop" in err.text, err.text
    assert "failed" in last_reply(drv).get_attribute("class")
    assert drv.find_element(By.ID, "input").get_attribute("value") == "Hello"

    # New conversation clears the log.
    drv.find_element(By.ID, "new").click()
    assert drv.find_elements(By.CSS_SELECTOR, "#log li") == []
    assert not drv.find_element(By.ID, "error").is_displayed()

    # No script errors, and nothing fetched from elsewhere.
    problems = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"
                and "401" not in e["message"] and "400" not in e["message"]]
    assert problems == [], problems
    urls = drv.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith(server + "/") for u in urls), urls


# The page's next fetch answers `response` (a JS expression) instead of the server.
FAKE_NEXT_FETCH = """
    const real = window.fetch;
    window.fetch = () => { window.fetch = real; return Promise.resolve(%s); };
"""


def test_chat_page_shows_errors(server, browser):
    drv = browser
    drv.get(server + "/")  # the key is still in localStorage
    wait(drv, lambda d: d.find_element(By.ID, "model").get_attribute("data-loaded") == "true")
    cases = [
        # The bounded queue is full (or the engine stopped): 503 with the server's message.
        ("new Response(JSON.stringify({error: {message: 'the waiting queue is full', "
         "type: 'server_error'}}), {status: 503, headers: {'content-type': 'application/json'}})",
         ["HTTP 503: the waiting queue is full.", "try again later"], ""),
        # A step failed mid-stream: an error event before [DONE]; the text so far stays.
        ("new Response('data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\\n\\n"
         "data: {\"error\":{\"message\":\"step failed\",\"type\":\"server_error\"}}\\n\\n"
         "data: [DONE]\\n\\n', {status: 200, headers: {'content-type': 'text/event-stream'}})",
         ["Server error: step failed"], "Hi"),
        # The connection ended without [DONE].
        ("new Response('data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"<b>x</b>\"}}]}\\n\\n', "
         "{status: 200, headers: {'content-type': 'text/event-stream'}})",
         ["ended before [DONE]"], "<b>x</b>"),
    ]
    for n, (response, expected, partial) in enumerate(cases, 1):
        drv.execute_script(FAKE_NEXT_FETCH % response)
        send(drv, "Hello")
        reply = wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log li.assistant")) == n
                     and (r := last_reply(d)).get_attribute("data-done") == "true" and r)
        err = drv.find_element(By.ID, "error")
        assert err.is_displayed() and all(e in err.text for e in expected), err.text
        assert "failed" in reply.get_attribute("class")
        content = reply.find_element(By.CLASS_NAME, "content")
        if partial:
            # Model output goes in as text: "<b>x</b>" is shown, not made bold.
            assert content.get_attribute("textContent") == partial
            assert content.find_elements(By.CSS_SELECTOR, "*") == []
        drv.find_element(By.ID, "input").clear()


def test_chat_page_json_mode(server, browser):
    # The JSON switch holds the reply to a JSON object: the page's reply is what the API
    # gives with response_format json_object, and it parses.
    drv = browser
    drv.get(server + "/")  # the key is still in localStorage
    wait(drv, lambda d: d.find_element(By.ID, "model").get_attribute("data-loaded") == "true")
    drv.find_element(By.ID, "new").click()
    drv.find_element(By.CSS_SELECTOR, "#model option[value='smol']").click()
    drv.find_element(By.CSS_SELECTOR, "#settings summary").click()
    set_value(drv, "temperature", 0)
    set_value(drv, "max_tokens", 60)
    drv.find_element(By.ID, "json").click()
    question = "Describe a cat as JSON."
    send(drv, question)
    reply = wait(drv, lambda d: (r := last_reply(d)).get_attribute("data-done") == "true" and r)
    text = reply.find_element(By.CLASS_NAME, "content").get_attribute("textContent")
    same = api(server, "/v1/chat/completions", {
        "model": "smol", "messages": [{"role": "user", "content": question}],
        "temperature": 0, "top_p": 1, "max_tokens": 60,
        "response_format": {"type": "json_object"}})
    assert text == same["choices"][0]["message"]["content"]
    assert text.startswith("{"), text
    if same["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text
