"""The demo room's HTTP side without a browser: the page and its assets, the old URL, and clear
errors for bad signalling. (tests/browser runs the page itself in Chromium.)"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from pipelines.pipecat_room import WEB_DIR, build_room_app


def _no_agent(_transport, _phone, _page_echo):
    raise AssertionError("no agent is built by these requests")


@pytest.fixture
def client():
    # the room answers loopback names only (pipelines.room_limits); TestClient's own is "testserver"
    with TestClient(build_room_app(_no_agent), base_url="http://localhost") as c:
        yield c


def test_the_page_and_its_assets_are_served(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for asset in re.findall(r'(?:src|href)="(assets/[^"]+)"', page.text):
        assert client.get(f"/{asset}").status_code == 200, asset
    assert client.get("/assets/levels-worklet.js").status_code == 200  # loaded by app.js
    old = client.get("/client/", follow_redirects=False)
    assert old.status_code in (302, 307) and old.headers["location"] == "/"


def test_the_page_names_no_other_host() -> None:
    """Offline means no URL to anywhere: every reference is relative to the agent that served it."""
    for path in WEB_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), path.name
        assert "@import" not in text and "fonts.googleapis" not in text, path.name


def test_bad_signalling_gets_a_reason_not_a_traceback(client) -> None:
    sid = client.post("/start", json={}).json()["sessionId"]
    bad = client.post(f"/sessions/{sid}/api/offer", json={"type": "offer"})  # no sdp
    assert bad.status_code == 400 and "sdp" in bad.json()["error"]
    assert client.post("/api/offer", content=b"not json").status_code == 415  # not even labelled JSON
    labelled = {"Content-Type": "application/json"}
    assert client.post("/api/offer", content=b"not json", headers=labelled).status_code == 400
    assert client.patch("/api/offer", json=[1, 2]).status_code == 400
    unknown = client.post("/sessions/nope/api/offer", json={"sdp": "", "type": "offer"})
    assert unknown.status_code == 404 and "POST /start" in unknown.json()["error"]
