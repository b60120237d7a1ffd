"""Bad input sent as raw JSON-RPC lines to the real process: every request is answered
and the process keeps serving. Raw lines carry what the SDK client cannot send."""

from __future__ import annotations

import json

from stdio_harness import RawSession, e2e_db_path, raw_session  # noqa: F401 (fixtures)


def tool_answer(reply: dict) -> tuple[dict, bool]:
    result = reply["result"]
    body = json.loads(result["content"][0]["text"])
    assert body == result.get("structuredContent")
    return body, result.get("isError", False)


def still_serving(session: RawSession) -> None:
    listed = session.reply(session.request("tools/list"))
    names = {tool["name"] for tool in listed["result"]["tools"]}
    assert {"store", "recall", "get_profile", "update_profile", "archive_episode", "list_memories",
            "list_episodes"} <= names  # later issues add tools


def test_lone_surrogate_escapes_are_answered_in_each_tools_own_shape(raw_session):  # spec G-6
    store, is_error = tool_answer(raw_session.call("store", '{"agent_id":"a","content":"bad \\ud800 text"}'))
    assert is_error is False
    assert store["ok"] is False and store["result"] == "rejected" and "$.content" in store["reason"]
    locked, _ = tool_answer(raw_session.call("store", '{"agent_id":"a","content":"x","lock":true,"metadata":{"k":"\\udc00"}}'))
    assert locked["locked"] is False and "$.metadata.k" in locked["reason"]  # spec ST-12
    recall, _ = tool_answer(raw_session.call("recall", '{"agent_id":"a","query":"x\\udc00"}'))
    assert recall["ok"] is False and recall["messages"] == [] and "lone UTF-16 surrogate" in recall["error"]
    episode, _ = tool_answer(raw_session.call("archive_episode", '{"agent_id":"a","summary":"s\\ud800"}'))
    assert episode["ok"] is False and episode["episode_id"] is None and "error" in episode
    profile, _ = tool_answer(raw_session.call("update_profile", '{"agent_id":"a","profile":"p\\ud800"}'))
    assert profile["ok"] is False and profile["profiles_updated"] == 0 and "reason" in profile
    listing, _ = tool_answer(raw_session.call("list_memories", '{"agent_id":"a\\ud800"}'))
    assert listing["ok"] is False and "error" in listing
    still_serving(raw_session)


def test_ten_thousand_levels_of_nesting_are_answered_not_dropped(raw_session):
    deep = '{"k":' * 10_000 + "1" + "}" * 10_000
    body, is_error = tool_answer(raw_session.call("store", '{"agent_id":"a","content":"deep","metadata":%s}' % deep))
    assert is_error is True
    assert body == {"ok": False, "error": "Input validation error: the request could not be read: it is nested too deeply"}
    still_serving(raw_session)


def test_nesting_the_sdk_cannot_parse_but_python_can_meets_the_depth_bound(raw_session):
    deep = '{"k":' * 500 + "1" + "}" * 500
    body, is_error = tool_answer(raw_session.call("store", '{"agent_id":"a","content":"deep","metadata":%s}' % deep))
    assert is_error is True
    assert body["error"].startswith("Input validation error: arguments are nested deeper than 32 levels")
    still_serving(raw_session)


def test_a_line_that_is_not_json_is_skipped_and_the_next_request_answered(raw_session):
    raw_session.send_line("this is not JSON at all")
    raw_session.send_line('{"jsonrpc":"2.0","id":')  # cut off: no id can be read
    still_serving(raw_session)


def test_non_tool_request_that_cannot_be_read_gets_a_json_rpc_parse_error(raw_session):
    request_id = raw_session.request("tools/list", raw_params='{"x": %s}' % ("[" * 10_000 + "]" * 10_000))
    reply = raw_session.reply(request_id)
    assert reply["error"]["code"] == -32700
    assert "nested too deeply" in reply["error"]["message"]
    still_serving(raw_session)


def test_surrogate_outside_tool_arguments_cannot_break_the_connection(raw_session):
    # The SDK echoes an unknown method name; an echoed lone surrogate would make its
    # UTF-8 writer fail and end the process.
    reply = raw_session.reply(raw_session.request("tools/\ud800"))
    assert reply["error"]["code"] == -32601
    reply = raw_session.reply(raw_session.request("tools/list", raw_params='{"cursor":"\\ud800"}'))
    assert "result" in reply or "error" in reply
    body, _ = tool_answer(raw_session.call("no_such_\ud800", "{}"))
    assert body == {"ok": False, "error": "Unknown tool: no_such_\ufffd"}
    still_serving(raw_session)


def test_huge_content_is_stored_nul_refused_and_the_process_keeps_serving(raw_session):  # spec ST-3, decision 11
    huge = json.dumps({"agent_id": "a", "content": "word " * 1_000_000})  # 5 MB
    body, is_error = tool_answer(raw_session.call("store", huge, timeout=120))
    assert is_error is False and body["result"] == "stored" and body["truncated"] is True
    nul, _ = tool_answer(raw_session.call("store", json.dumps({"agent_id": "a", "content": "before\x00after"})))
    assert nul["result"] == "rejected" and "NUL character (U+0000) at position 6" in nul["reason"]
    listed, _ = tool_answer(raw_session.call("list_memories", '{"agent_id":"a"}'))
    contents = {m["content"] for m in listed["memories"]}
    assert len(contents) == 1 and max(len(c) for c in contents) <= 16_000
    still_serving(raw_session)
