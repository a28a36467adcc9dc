//! Tests of [`super`]: reading Anthropic requests.

use super::*;

fn req(extra: Value) -> Value {
    let mut b = json!({"model": "m", "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn err(body: Value) -> ApiError {
    read(body, false, 16).err().expect("refused")
}

#[test]
fn required_and_unknown_fields_are_named() {
    let mut b = req(json!({}));
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(err(b.clone()).param.as_deref(), Some("max_tokens"));
    assert!(
        read(b, true, 16).is_ok(),
        "count_tokens needs no max_tokens"
    );
    assert_eq!(
        err(req(json!({"container": "x"}))).param.as_deref(),
        Some("container")
    );
    assert_eq!(
        err(req(json!({"temperature": "hot"}))).param.as_deref(),
        Some("temperature")
    );
    assert!(read(
        req(json!({"metadata": {"user_id": "u"}, "service_tier": "auto"})),
        false,
        16
    )
    .is_ok());
}

#[test]
fn blocks_become_template_messages() {
    let a = read(
        req(
            json!({"system": [{"type": "text", "text": "be brief"}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "thanks"}]}]}),
        ),
        false,
        16,
    )
    .unwrap();
    let m = &a.turn.messages;
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(m[0].content, "be brief");
    assert_eq!(
        m[2].tool_calls.as_ref().unwrap()[0]["function"]["arguments"]["c"],
        "P"
    );
    assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(m[3].name.as_deref(), Some("w"));
    assert_eq!(a.turn.template_kwargs["enable_thinking"], json!(false));
}

#[test]
fn bad_blocks_are_refused() {
    let e = err(req(json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]})));
    assert!(e.message.contains("\"image\""), "{e:?}");
    let e = err(req(json!({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]})));
    assert!(e.message.contains("toolu_x"), "{e:?}");
    let e = err(req(json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "The answer is"}]})));
    assert_eq!(e.param.as_deref(), Some("messages[1]"), "{e:?}");
}

#[test]
fn tool_choice_translates() {
    let tools = json!([{"name": "w", "description": "d", "input_schema": {"type": "object"}}]);
    let a = read(
        req(
            json!({"tools": tools, "tool_choice": {"type": "tool", "name": "w",
        "disable_parallel_tool_use": true}}),
        ),
        false,
        16,
    )
    .unwrap();
    let t = a.turn.tools.unwrap();
    assert_eq!(t.choice, crate::tools::ToolChoice::Named("w".into()));
    assert!(!t.parallel);
    let a = read(
        req(json!({"tools": tools, "tool_choice": {"type": "any"}})),
        false,
        16,
    )
    .unwrap();
    assert_eq!(
        a.turn.tools.unwrap().choice,
        crate::tools::ToolChoice::Required
    );
    assert_eq!(
        err(req(json!({"tools": tools, "tool_choice": {"type": "x"}})))
            .param
            .as_deref(),
        Some("tool_choice")
    );
    assert!(
        read(
            req(
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048})
            ),
            false,
            16
        )
        .unwrap()
        .turn
        .template_kwargs["enable_thinking"]
            == json!(true)
    );
}
