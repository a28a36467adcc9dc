//! The OpenAI Responses dialect (`/v1/responses`): string and item input, instructions,
//! `text.format`, the typed event stream, the response store and `previous_response_id`,
//! and bad input refused with 400 naming the field. The tool round trip runs on Qwen2.5-Coder
//! 0.5B (its template takes tools), when it is cached.

mod common;

use common::{engine, start, start_opts, Server};
use serde_json::{json, Value};

async fn get(s: &Server, path: &str) -> (u16, Value) {
    let r = s
        .client
        .get(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn delete(s: &Server, path: &str) -> (u16, Value) {
    let r = s
        .client
        .delete(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    let mut s = String::new();
    for item in r["output"].as_array().unwrap() {
        if item["type"] == "message" {
            for c in item["content"].as_array().unwrap() {
                s.push_str(c["text"].as_str().unwrap());
            }
        }
    }
    s
}

/// A streamed response's events: (the `event:` name, the data).
async fn stream(s: &Server, body: Value) -> Vec<(String, Value)> {
    let events = s.sse("/v1/responses", body).await;
    events
        .into_iter()
        .map(|(n, d)| (n, serde_json::from_str(&d).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_and_item_input_with_instructions() {
    let s = start(|_| {}, None).await;
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"input": "Say hello.", "instructions": "You are terse.",
                "max_output_tokens": 8, "temperature": 0, "store": false,
                "metadata": {"k": "v"}, "user": "u1"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()));
    assert_eq!(r["instructions"], "You are terse.");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(r["max_output_tokens"], 8);
    assert_eq!(r["store"], false);
    let msg = &r["output"][0];
    assert_eq!(msg["type"], "message");
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["content"][0]["type"], "output_text");
    let u = &r["usage"];
    assert!(u["input_tokens"].as_u64().unwrap() > 5);
    assert!(u["output_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    // The same conversation as items gives the same greedy answer.
    let (status, r2) = s
        .post(
            "/v1/responses",
            json!({"input": [{"type": "message", "role": "developer",
                    "content": [{"type": "input_text", "text": "You are terse."}]},
                {"role": "user", "content": "Say hello."}],
                "max_output_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(output_text(&r), output_text(&r2));
    assert_eq!(r["usage"]["input_tokens"], r2["usage"]["input_tokens"]);
    // A response cut at max_output_tokens is incomplete.
    let (_, r) = s
        .post(
            "/v1/responses",
            json!({"input": "Write a long story.", "max_output_tokens": 3, "temperature": 0}),
        )
        .await;
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    // The ignore_eos extension decodes to max_output_tokens past the end of turn: a short
    // answer stops early without it, runs to the limit with it.
    let ask = |ignore: bool| {
        json!({"input": "Say yes.", "instructions": "Answer with one word.",
            "max_output_tokens": 40, "temperature": 0, "store": false, "ignore_eos": ignore})
    };
    let (_, short) = s.post("/v1/responses", ask(false)).await;
    assert!(
        short["usage"]["output_tokens"].as_u64().unwrap() < 40,
        "{short}"
    );
    let (status, long) = s.post("/v1/responses", ask(true)).await;
    assert_eq!(status, 200, "{long}");
    assert_eq!(long["usage"]["output_tokens"], 40, "{long}");
    let (status, e) = s
        .post("/v1/responses", json!({"input": "x", "ignore_eos": "yes"}))
        .await;
    assert_eq!(
        (status, e["error"]["param"].as_str()),
        (400, Some("ignore_eos")),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_format_gives_valid_json() {
    let s = start(|_| {}, None).await;
    let schema = json!({"type": "object", "properties": {"name": {"type": "string",
        "maxLength": 10}, "age": {"type": "integer"}}, "required": ["name", "age"],
        "additionalProperties": false});
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"input": "A person as JSON.", "max_output_tokens": 64, "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "person",
                    "schema": schema, "strict": true}}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let v: Value = serde_json::from_str(&output_text(&r)).unwrap();
    assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
    assert_eq!(r["text"]["format"]["type"], "json_schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_openai_events_in_order() {
    let s = start(|_| {}, None).await;
    let evs = stream(
        &s,
        json!({"input": "Say hello.", "max_output_tokens": 12, "temperature": 0,
            "stream": true}),
    )
    .await;
    for (i, (name, data)) in evs.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "the event name is the type");
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "{names:?}");
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    let last = *names.last().unwrap();
    assert!(
        last == "response.completed" || last == "response.incomplete",
        "{names:?}"
    );
    assert_eq!(&names[..names.len() - 1], &want[..]);
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let done = &evs.last().unwrap().1["response"];
    assert_eq!(output_text(done), text);
    assert_eq!(evs[0].1["response"]["status"], "in_progress");
    // The streamed response was stored, and matches.
    let (status, got) = get(
        &s,
        &format!("/v1/responses/{}", done["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(&got, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_get_delete_and_continue() {
    let s = start(|_| {}, None).await;
    let (_, r1) = s
        .post(
            "/v1/responses",
            json!({"input": "My name is Ada. Say hi.", "max_output_tokens": 10,
                "temperature": 0}),
        )
        .await;
    let id = r1["id"].as_str().unwrap().to_string();
    let (status, got) = get(&s, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(got, r1);
    let hits0 = s.metric("tessera_prefix_cache_hits_total").await;
    let (status, r2) = s
        .post(
            "/v1/responses",
            json!({"input": "What is my name?", "previous_response_id": id,
                "max_output_tokens": 10, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], id.as_str());
    let (in1, out1) = (
        r1["usage"]["input_tokens"].as_u64().unwrap(),
        r1["usage"]["output_tokens"].as_u64().unwrap(),
    );
    let in2 = r2["usage"]["input_tokens"].as_u64().unwrap();
    assert!(
        in2 > in1 + out1,
        "the earlier turn is in the prompt: {in1}+{out1} vs {in2}"
    );
    // The first prompt's whole blocks came from the prefix cache.
    let hits = s.metric("tessera_prefix_cache_hits_total").await - hits0;
    assert!(
        hits >= ((in1 / 16) * 16) as f64 && hits > 0.0,
        "{hits} of {in1}"
    );
    // The chain goes on from the second response.
    let (status, r3) = s
        .post(
            "/v1/responses",
            json!({"input": "Thanks.", "previous_response_id": r2["id"],
                "max_output_tokens": 4}),
        )
        .await;
    assert_eq!(status, 200, "{r3}");
    assert!(r3["usage"]["input_tokens"].as_u64().unwrap() > in2);
    // The third response's input items: the whole conversation before it, newest first
    // (three user turns and two answers), paged, with the same ids on every call.
    let r3_id = r3["id"].as_str().unwrap();
    let (status, l) = get(&s, &format!("/v1/responses/{r3_id}/input_items")).await;
    assert_eq!(status, 200, "{l}");
    assert_eq!(
        (&l["object"], &l["has_more"]),
        (&json!("list"), &json!(false))
    );
    let data = l["data"].as_array().unwrap();
    assert_eq!(data.len(), 5, "{l}");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(data[0]["content"], "Thanks.");
    assert_eq!(data[4]["content"], "My name is Ada. Say hi.");
    assert_eq!(data[1]["role"], "assistant");
    assert!(data
        .iter()
        .all(|it| it["type"] == "message" && it["id"].is_string()));
    assert_eq!(
        (&l["first_id"], &l["last_id"]),
        (&data[0]["id"], &data[4]["id"])
    );
    let (_, page) = get(
        &s,
        &format!("/v1/responses/{r3_id}/input_items?order=asc&limit=2"),
    )
    .await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0], data[4]);
    let after = page["last_id"].as_str().unwrap();
    let (_, rest) = get(
        &s,
        &format!("/v1/responses/{r3_id}/input_items?order=asc&limit=10&after={after}"),
    )
    .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 3, "{rest}");
    assert_eq!(rest["has_more"], false);
    for (q, param) in [
        ("limit=0", "limit"),
        ("order=up", "order"),
        ("page=2", "page"),
    ] {
        let (status, e) = get(&s, &format!("/v1/responses/{r3_id}/input_items?{q}")).await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{e}"
        );
    }
    let (status, _) = get(&s, "/v1/responses/resp_nope/input_items").await;
    assert_eq!(status, 404);
    // Deleted: gone, and named in the 404.
    let (status, d) = delete(&s, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(d, json!({"id": id, "object": "response", "deleted": true}));
    for (status, e) in [
        get(&s, &format!("/v1/responses/{id}")).await,
        delete(&s, &format!("/v1/responses/{id}")).await,
    ] {
        assert_eq!(status, 404);
        assert!(e["error"]["message"].as_str().unwrap().contains(&id), "{e}");
    }
    let (status, e) = s
        .post(
            "/v1/responses",
            json!({"input": "x", "previous_response_id": "resp_nope"}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resp_nope"));
    // store false keeps nothing.
    let (_, r) = s
        .post(
            "/v1/responses",
            json!({"input": "x", "store": false, "max_output_tokens": 2}),
        )
        .await;
    let (status, _) = get(&s, &format!("/v1/responses/{}", r["id"].as_str().unwrap())).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_smaller_than_a_response_keeps_nothing() {
    let s = start_opts(engine(), |o| o.http.responses_store_bytes = 300).await;
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"input": "Hello there.", "max_output_tokens": 4}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, _) = get(&s, &format!("/v1/responses/{}", r["id"].as_str().unwrap())).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field() {
    let s = start(|_| {}, None).await;
    let cases = [
        (
            json!({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}),
            "input[0].call_id",
            "call_x",
        ),
        (
            json!({"input": [{"type": "bogus"}]}),
            "input[0].type",
            "bogus",
        ),
        (
            json!({"input": [{"role": "wizard", "content": "x"}]}),
            "input[0].role",
            "wizard",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
            "input_image",
        ),
        (json!({"input": [7]}), "input[0]", "object"),
        (json!({"input": 7}), "input", "string"),
        (json!({"input": []}), "input", "empty"),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
            "web_search",
        ),
        (
            json!({"input": "x", "frobnicate": 1}),
            "frobnicate",
            "frobnicate",
        ),
        (
            json!({"input": "x", "truncation": "auto"}),
            "truncation",
            "auto",
        ),
        (
            json!({"input": "x", "background": true}),
            "background",
            "background",
        ),
        (
            json!({"input": "x", "conversation": "c1"}),
            "conversation",
            "conversation",
        ),
        (
            json!({"input": "x", "max_output_tokens": -1}),
            "max_output_tokens",
            "",
        ),
        (
            json!({"input": "x", "temperature": "hot"}),
            "temperature",
            "",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
            "xml",
        ),
        (
            json!({"input": "x", "include": ["file_search_call.results"]}),
            "include",
            "file_search",
        ),
        (json!({"input": "x", "top_logprobs": 3}), "top_logprobs", ""),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}]}),
            "tools",
            "template",
        ),
        (
            json!({"input": "x", "tool_choice": "required"}),
            "tool_choice",
            "tools",
        ),
        (json!([1, 2]), "body", "object"),
    ];
    for (body, param, word) in cases {
        let (status, e) = s.post("/v1/responses", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {e}");
        assert_eq!(e["error"]["param"], param, "{body} -> {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(word),
            "{body} -> {e}"
        );
    }
    // Hints are accepted.
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"input": "x", "max_output_tokens": 2, "service_tier": "auto",
                "prompt_cache_key": "k", "safety_identifier": "s", "prediction": null,
                "reasoning": {"effort": "low", "summary": "auto"},
                "include": ["reasoning.encrypted_content"], "truncation": "disabled"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    s.assert_drained().await;
}

/// Qwen2.5-Coder 0.5B, whose template takes tools (`None` when it is not cached).
fn qwen() -> Option<tessera_engine::Engine> {
    let path = dirs_home()?.join(".cache/tessera/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("SKIPPED: {} is not cached", path.display());
        return None;
    }
    Some(
        tessera_engine::Engine::load_with(
            &path,
            2,
            tessera_kernels::plan::Precision::Fast,
            tessera_kernels::planner::Planner::untuned(),
        )
        .unwrap(),
    )
}

fn dirs_home() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(std::path::PathBuf::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_tool_round_trip() {
    let Some(e) = qwen() else { return };
    let s = start_opts(e, |o| o.scheduler.max_model_len = 2048).await;
    let tools = json!([{"type": "function", "name": "get_weather",
        "description": "The weather in a city.", "strict": true,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": false}}]);
    let (status, r) = s
        .post(
            "/v1/responses",
            json!({"input": "What is the weather in Paris?", "tools": tools,
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": 64, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call: {r}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    assert_eq!(r["tool_choice"]["name"], "get_weather");
    // The call's output on the next turn, through previous_response_id.
    let (status, r2) = s
        .post(
            "/v1/responses",
            json!({"previous_response_id": r["id"], "tools": tools,
                "input": [{"type": "function_call_output", "call_id": call["call_id"],
                    "output": "{\"temp_c\": 21}"}],
                "max_output_tokens": 24, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["output"][0]["type"], "message", "{r2}");
    // And as whole items, without the store.
    let (status, r3) = s
        .post(
            "/v1/responses",
            json!({"tools": tools, "store": false,
                "input": [{"role": "user", "content": "What is the weather in Paris?"},
                    {"type": "function_call", "call_id": call["call_id"], "name": "get_weather",
                        "arguments": call["arguments"]},
                    {"type": "function_call_output", "call_id": call["call_id"],
                        "output": "{\"temp_c\": 21}"}],
                "max_output_tokens": 24, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r3}");
    assert_eq!(output_text(&r2), output_text(&r3));
    // Streamed: the call's events.
    let evs = stream(
        &s,
        json!({"input": "What is the weather in Paris?", "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": false,
            "max_output_tokens": 64, "temperature": 0, "stream": true}),
    )
    .await;
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let added = names
        .iter()
        .position(|n| *n == "response.output_item.added")
        .unwrap();
    assert_eq!(evs[added].1["item"]["type"], "function_call", "{names:?}");
    assert!(names.contains(&"response.function_call_arguments.delta"));
    let done = names
        .iter()
        .position(|n| *n == "response.function_call_arguments.done")
        .unwrap();
    let args: String = evs
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["arguments"].as_str().or(d["delta"].as_str()).unwrap())
        .collect();
    assert_eq!(evs[done].1["arguments"], args.as_str());
    assert_eq!(*names.last().unwrap(), "response.completed");
    let out = &evs.last().unwrap().1["response"]["output"];
    assert_eq!(
        out[out.as_array().unwrap().len() - 1]["arguments"],
        args.as_str()
    );
}
