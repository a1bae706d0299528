//! Requests and answers of SGLang's serving API, pure: `/generate` (native), `/v1/completions`
//! and `/v1/chat/completions` (OpenAI), whole or as server-sent events. The stand-in's
//! "tokenizer" counts one token per 4 bytes of text (at least one); its output is a fixed word
//! list, so answers are deterministic.

use serde_json::{Value, json};

/// SGLang's default `max_new_tokens`.
pub const DEFAULT_MAX_NEW_TOKENS: u64 = 128;
/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const DEFAULT_COMPLETION_TOKENS: u64 = 16;
const WORDS: [&str; 16] =
    ["the", "KV", "cache", "moved", "from", "prefill", "to", "decode", "along", "its", "rank", "map", "and", "every", "byte", "checked"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Generate,
    Completions,
    Chat,
}

/// What the gateway adds for a PD pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: String,
    pub port: Option<u16>,
    pub room: u64,
    pub prefill_dp_rank: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    pub api: Api,
    pub stream: bool,
    pub include_usage: bool,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub model: Option<String>,
    pub bootstrap: Option<Bootstrap>,
}

fn text_tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4).max(1)
}

fn prompt_of(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::String(s) => Some(text_tokens(s)),
        Value::Array(a) if a.iter().all(Value::is_number) => Some((a.len() as u64).max(1)),
        Value::Array(a) => a.first().and_then(|x| prompt_of(Some(x))),
        _ => None,
    }
}

fn content_tokens(c: &Value) -> u64 {
    match c {
        Value::String(s) => s.len() as u64,
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(|s| s.len() as u64).sum(),
        _ => 0,
    }
}

fn chat_tokens(messages: &[Value]) -> u64 {
    // Content plus a few template tokens per message.
    let bytes: u64 = messages.iter().map(|m| m.get("content").map_or(0, content_tokens) + 16).sum();
    bytes.div_ceil(4).max(1)
}

fn bootstrap(body: &Value) -> Result<Option<Bootstrap>, String> {
    let Some(room) = body.get("bootstrap_room").filter(|v| !v.is_null()) else { return Ok(None) };
    let room = room.as_u64().ok_or_else(|| format!("bootstrap_room must be a non-negative integer, got {room}"))?;
    let host = body.get("bootstrap_host").and_then(Value::as_str).unwrap_or("127.0.0.1").to_owned();
    let port = match body.get("bootstrap_port") {
        None | Some(Value::Null) => None,
        Some(p) => Some(p.as_u64().and_then(|p| u16::try_from(p).ok()).ok_or_else(|| format!("bootstrap_port must be a port, got {p}"))?),
    };
    let prefill_dp_rank = body.get("disagg_prefill_dp_rank").and_then(Value::as_i64);
    Ok(Some(Bootstrap { host, port, room, prefill_dp_rank }))
}

fn uint(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64)
}

/// Reads a request body the way the endpoint does; the error is a 400 message.
pub fn parse(api: Api, body: &Value) -> Result<GenRequest, String> {
    let obj = body.as_object().ok_or("the request body must be a JSON object")?;
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let (prompt_tokens, max_tokens) = match api {
        Api::Generate => {
            let p = prompt_of(obj.get("input_ids"))
                .or_else(|| prompt_of(obj.get("text")))
                .ok_or("Either text or input_ids should be provided.")?;
            (p, uint(obj.get("sampling_params").and_then(|s| s.get("max_new_tokens"))).unwrap_or(DEFAULT_MAX_NEW_TOKENS))
        }
        Api::Completions => {
            let p = prompt_of(obj.get("prompt")).ok_or("prompt is required")?;
            (p, uint(obj.get("max_tokens")).unwrap_or(DEFAULT_COMPLETION_TOKENS))
        }
        Api::Chat => {
            let msgs = obj.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty()).ok_or("messages is required")?;
            let max = uint(obj.get("max_completion_tokens")).or_else(|| uint(obj.get("max_tokens"))).unwrap_or(DEFAULT_MAX_NEW_TOKENS);
            (chat_tokens(msgs), max)
        }
    };
    Ok(GenRequest {
        api,
        stream,
        include_usage: body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
        prompt_tokens,
        max_tokens,
        model: obj.get("model").and_then(Value::as_str).map(str::to_owned),
        bootstrap: bootstrap(body)?,
    })
}

/// The text of output token `i` of a request seeded by `seed`.
pub fn token_text(seed: u64, i: u64) -> String {
    format!(" {}", WORDS[((seed.wrapping_add(i)) % WORDS.len() as u64) as usize])
}

/// Fixed facts of one answer.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: u64,
}

fn usage(m: &Meta, completion: u64) -> Value {
    json!({"prompt_tokens": m.prompt_tokens, "total_tokens": m.prompt_tokens + completion, "completion_tokens": completion, "prompt_tokens_details": null})
}

fn finish(done: bool, completion: u64, max: u64) -> Value {
    match (done, completion >= max) {
        (false, _) => Value::Null,
        (true, true) => json!({"type": "length", "length": completion}),
        (true, false) => json!({"type": "stop", "matched": null}),
    }
}

fn openai_finish(done: bool) -> Value {
    if done { Value::from("length") } else { Value::Null }
}

/// A whole (non-streamed) answer.
pub fn full(api: Api, m: &Meta, text: &str, completion: u64, e2e: f64) -> Value {
    match api {
        Api::Generate => json!({"text": text, "meta_info": {"id": m.id, "finish_reason": finish(true, completion, completion),
            "prompt_tokens": m.prompt_tokens, "completion_tokens": completion, "cached_tokens": 0, "e2e_latency": e2e}}),
        Api::Completions => json!({"id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length", "matched_stop": null}],
            "usage": usage(m, completion)}),
        Api::Chat => json!({"id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": null, "tool_calls": null},
                "logprobs": null, "finish_reason": "length", "matched_stop": null}],
            "usage": usage(m, completion)}),
    }
}

/// One SSE event carrying token `delta`; `/generate` streams the text so far (`cumulative`).
pub fn chunk(api: Api, m: &Meta, delta: &str, cumulative: &str, completion: u64, done: bool) -> Value {
    match api {
        Api::Generate => json!({"text": cumulative, "meta_info": {"id": m.id, "finish_reason": finish(done, completion, completion),
            "prompt_tokens": m.prompt_tokens, "completion_tokens": completion, "cached_tokens": 0}}),
        Api::Completions => json!({"id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
            "choices": [{"index": 0, "text": delta, "logprobs": null, "finish_reason": openai_finish(done), "matched_stop": null}]}),
        Api::Chat => json!({"id": m.id, "object": "chat.completion.chunk", "created": m.created, "model": m.model,
            "choices": [{"index": 0, "delta": if done { json!({}) } else { json!({"role": "assistant", "content": delta}) },
                "logprobs": null, "finish_reason": openai_finish(done), "matched_stop": null}]}),
    }
}

/// The usage-only chunk OpenAI streams when `stream_options.include_usage` is set.
pub fn usage_chunk(api: Api, m: &Meta, completion: u64) -> Option<Value> {
    let object = match api {
        Api::Generate => return None,
        Api::Completions => "text_completion",
        Api::Chat => "chat.completion.chunk",
    };
    Some(json!({"id": m.id, "object": object, "created": m.created, "model": m.model, "choices": [], "usage": usage(m, completion)}))
}

/// The error body of an aborted or refused request: OpenAI's shape or the native one.
pub fn error(api: Api, status: u16, message: &str) -> Value {
    let kind = if status >= 500 { "InternalServerError" } else { "BadRequestError" };
    match api {
        Api::Generate => json!({"error": {"message": message}}),
        _ => json!({"object": "error", "message": message, "type": kind, "param": null, "code": status}),
    }
}

pub fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_three_apis_and_the_gateway_fields() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hello world!"}], "max_tokens": 4, "stream": true,
            "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 12345});
        let r = parse(Api::Chat, &chat).unwrap();
        assert_eq!((r.stream, r.max_tokens, r.prompt_tokens), (true, 4, 7));
        assert_eq!(r.bootstrap, Some(Bootstrap { host: "10.0.0.1".into(), port: Some(8998), room: 12345, prefill_dp_rank: None }));
        let g = parse(
            Api::Generate,
            &json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "bootstrap_port": null, "bootstrap_room": 1}),
        )
        .unwrap();
        assert_eq!((g.prompt_tokens, g.max_tokens, g.bootstrap.unwrap().port), (3, 2, None));
        let c = parse(Api::Completions, &json!({"prompt": "abcdefgh"})).unwrap();
        assert_eq!((c.prompt_tokens, c.max_tokens, c.bootstrap), (2, DEFAULT_COMPLETION_TOKENS, None));
        assert!(parse(Api::Generate, &json!({})).is_err());
        assert!(parse(Api::Chat, &json!({"messages": [], "bootstrap_room": 1})).is_err());
        assert!(parse(Api::Completions, &json!({"prompt": "x", "bootstrap_room": -1})).is_err());
    }

    #[test]
    fn answers_have_openai_and_native_shapes() {
        let m = Meta { id: "x".into(), created: 1, model: "m".into(), prompt_tokens: 3 };
        let c = full(Api::Chat, &m, " a b", 2, 0.1);
        assert_eq!((c["choices"][0]["message"]["content"].as_str(), c["usage"]["total_tokens"].as_u64()), (Some(" a b"), Some(5)));
        let g = full(Api::Generate, &m, " a", 1, 0.1);
        assert_eq!(g["meta_info"]["finish_reason"]["type"], "length");
        let s = chunk(Api::Chat, &m, " a", " a", 1, false);
        assert_eq!(s["choices"][0]["delta"]["content"], " a");
        assert_eq!(chunk(Api::Chat, &m, "", " a", 1, true)["choices"][0]["finish_reason"], "length");
        assert!(usage_chunk(Api::Generate, &m, 1).is_none());
        assert_eq!(error(Api::Chat, 500, "boom")["code"], 500);
        assert_eq!(token_text(0, 0), " the");
    }
}
