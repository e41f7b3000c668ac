//! `http`: Warden's first-party tool plugin for HTTP requests to the hosts
//! an operator granted.
//!
//! | tool | effect | arguments | output |
//! | --- | --- | --- | --- |
//! | `http_get` | read | `url`, `method?` (`GET` or `HEAD`), `headers?`, `auth?`, `max_bytes?`, `max_redirects?` | [`HttpOutput`] |
//! | `http_request` | write | `method`, `url`, `headers?`, `auth?`, `body?`, `max_bytes?` | [`HttpOutput`] |
//!
//! Effects are per tool in Warden, so the effect of a method is the tool it
//! goes through: `http_get` only sends `GET` and `HEAD` and is `read`;
//! `http_request` sends any method and is `write`, with a preflight that
//! shows the method, URL, headers and body. (A plugin granted a host is
//! treated as `write` anyway unless the operator sets the tool's effect, as
//! an operator deploying this plugin for reads does with
//! `[tools.http_get] effect = "read"`.)
//!
//! The output carries the status, the response headers named in
//! [`SELECTED_HEADERS`] plus those in the config value `response_headers`
//! (comma-separated), and the body as text, cut at `max_bytes` (default
//! 256 KiB, at most 1 MiB). `http_get` follows up to `max_redirects`
//! redirects (default 5); each hop is a new request the host checks against
//! the grant, and `authorization` and `cookie` headers are dropped when a
//! hop leaves the original host. `http_request` never follows redirects.
//!
//! Secrets: the plugin asks for any secret the operator grants
//! (`secrets = ["*"]`) and uses each by handle, never by value: `auth`
//! (`{"secret": NAME, "scheme": "bearer" | "basic", "username"?}`) becomes
//! the `authorization` header, and `{{secret:NAME}}` inside a header value
//! becomes the secret. The host fills them in only for the hosts the
//! operator bound the secret to, and removes the header for any other
//! (a redirect included), so neither the plugin nor the model ever holds
//! the value.
//!
//! Config: `timeout_ms` (connect, first byte and between bytes; default
//! 10,000), `response_headers`.
//!
//! Errors: a request the host's policy refuses is `denied`, naming the host;
//! a bad URL, method or header is `invalid-arguments`; timeouts and transport
//! failures are `failed` and retryable; a response over the lease's response
//! limit is `failed`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warden_guest::http::{self, HttpError, Request, Response, Url};
use warden_guest::secrets::{self, SecretError, SecretForm};
use warden_guest::{Call, Effect, Preview, Tool, ToolError, ToolPlugin, Toolbox};

/// Response headers always returned when present.
pub const SELECTED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "location",
    "etag",
    "last-modified",
    "cache-control",
    "retry-after",
    "date",
];

/// Default for `max_bytes`: 256 KiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 10;
/// Largest `max_bytes`: 1 MiB.
pub const MAX_BYTES: usize = 1 << 20;
/// Default for `max_redirects`.
pub const DEFAULT_REDIRECTS: u32 = 5;
/// Largest `max_redirects`.
pub const MAX_REDIRECTS: u32 = 10;
/// Default for the `timeout_ms` config value.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// Arguments of `http_get`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetArgs {
    /// The absolute http or https URL.
    pub url: String,
    /// `GET` (the default) or `HEAD`.
    #[serde(default)]
    pub method: Option<String>,
    /// Request headers, name to value; `{{secret:NAME}}` in a value stands for a granted secret.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A granted secret sent as the `authorization` header.
    #[serde(default)]
    pub auth: Option<Auth>,
    /// Most body bytes returned (default 262144, at most 1048576); `truncated` says the body went on.
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// Redirects followed (default 5, at most 10); 0 returns a redirect response as it is.
    #[serde(default)]
    pub max_redirects: Option<u32>,
}

/// Arguments of `http_request`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestArgs {
    /// The method, for example POST, PUT, PATCH or DELETE.
    pub method: String,
    /// The absolute http or https URL.
    pub url: String,
    /// Request headers, name to value; `{{secret:NAME}}` in a value stands for a granted secret.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A granted secret sent as the `authorization` header.
    #[serde(default)]
    pub auth: Option<Auth>,
    /// The request body, as text.
    #[serde(default)]
    pub body: Option<String>,
    /// Most body bytes returned (default 262144, at most 1048576); `truncated` says the body went on.
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// A granted secret sent as the `authorization` header, by handle.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// The name of a secret the operator granted.
    pub secret: String,
    /// `bearer` (the default) or `basic`.
    #[serde(default)]
    pub scheme: AuthScheme,
    /// The username, for `basic`.
    #[serde(default)]
    pub username: Option<String>,
}

/// How `auth` is written.
#[derive(Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AuthScheme {
    /// `Bearer <secret>`.
    #[default]
    Bearer,
    /// `Basic <base64 of username:secret>`.
    Basic,
}

/// What both tools return.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HttpOutput {
    /// The URL that answered (after redirects).
    pub url: String,
    /// The status code.
    pub status: u16,
    /// Selected response headers, lowercase names.
    pub headers: BTreeMap<String, String>,
    /// The body as text (invalid UTF-8 replaced), at most `max_bytes`.
    pub body: String,
    /// Bytes of body returned.
    pub body_bytes: usize,
    /// Whether the body went on past `max_bytes`.
    pub truncated: bool,
    /// The URLs redirected through, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirects: Vec<String>,
}

/// The two tools.
pub fn toolbox() -> Toolbox {
    Toolbox::new()
        .tool(Tool::new(
            "http_get",
            "Fetch a URL with GET (or HEAD) from a host the operator granted. Returns the \
             status, selected headers and the body as text, cut at `max_bytes`. Follows \
             redirects; each hop must be to a granted host.",
            Effect::Read,
            |args: GetArgs, _call: &Call| get(args),
        ))
        .tool(
            Tool::new(
                "http_request",
                "Send an HTTP request with any method (POST, PUT, PATCH, DELETE, ...) and an \
                 optional text body to a host the operator granted. Returns the status, \
                 selected headers and the body as text. Does not follow redirects.",
                Effect::Write,
                |args: RequestArgs, _call: &Call| request(args),
            )
            .with_preflight(|args: RequestArgs, _call: &Call| preview(args)),
        )
}

/// `http_get`.
pub fn get(args: GetArgs) -> Result<HttpOutput, ToolError> {
    let method = args.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
    if method != "GET" && method != "HEAD" {
        return Err(ToolError::invalid_arguments(format!(
            "`method` is `{method}`; http_get sends GET or HEAD (use http_request for others)"
        )));
    }
    let max_bytes = max_bytes(args.max_bytes)?;
    let max_redirects = args.max_redirects.unwrap_or(DEFAULT_REDIRECTS);
    if max_redirects > MAX_REDIRECTS {
        return Err(ToolError::invalid_arguments(format!(
            "`max_redirects` is {max_redirects}, expected at most {MAX_REDIRECTS}"
        )));
    }
    let first = Url::parse(&args.url).map_err(tool_error)?;
    let all_headers = with_secrets(&args.headers, args.auth.as_ref())?;
    let mut url = first.clone();
    let mut redirects = Vec::new();
    loop {
        let leaves_origin = url.host_port() != first.host_port();
        let headers = all_headers
            .iter()
            .filter(|(name, _)| !(leaves_origin && is_credential(name)));
        let response = send(&method, &url, headers, Vec::new(), max_bytes)?;
        match response.redirect_location() {
            Some(location) if (redirects.len() as u32) < max_redirects => {
                let next = url.join(location).map_err(|e| {
                    ToolError::failed(format!("{url} redirected to an unusable location: {e}"))
                })?;
                redirects.push(url.to_string());
                url = next;
            }
            _ => return Ok(output(&url, response, redirects)),
        }
    }
}

/// `http_request`.
pub fn request(args: RequestArgs) -> Result<HttpOutput, ToolError> {
    let max_bytes = max_bytes(args.max_bytes)?;
    let method = check_method(&args.method)?;
    let url = Url::parse(&args.url).map_err(tool_error)?;
    let body = args.body.unwrap_or_default().into_bytes();
    let headers = with_secrets(&args.headers, args.auth.as_ref())?;
    let response = send(&method, &url, headers.iter(), body, max_bytes)?;
    Ok(output(&url, response, Vec::new()))
}

/// The preview of `http_request`: method and URL, then headers and body.
pub fn preview(args: RequestArgs) -> Result<Preview, ToolError> {
    let method = check_method(&args.method)?;
    let url = Url::parse(&args.url).map_err(tool_error)?;
    let body = args.body.unwrap_or_default();
    let mut detail = String::new();
    if let Some(auth) = &args.auth {
        detail.push_str(&format!(
            "authorization: secret `{}` ({:?}, attached by the host)\n",
            auth.secret, auth.scheme
        ));
    }
    for (name, value) in &args.headers {
        detail.push_str(&format!("{name}: {value}\n"));
    }
    if !body.is_empty() {
        if !detail.is_empty() {
            detail.push('\n');
        }
        detail.push_str(&body);
    }
    Ok(Preview::new(
        format!("{method} {url} ({} bytes of body)", body.len()),
        detail,
    ))
}

fn check_method(method: &str) -> Result<String, ToolError> {
    let upper = method.to_ascii_uppercase();
    if upper.is_empty() || !upper.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(ToolError::invalid_arguments(format!(
            "`method` is `{method}`, not an HTTP method"
        )));
    }
    Ok(upper)
}

fn max_bytes(max: Option<usize>) -> Result<usize, ToolError> {
    match max.unwrap_or(DEFAULT_MAX_BYTES) {
        n if n <= MAX_BYTES => Ok(n),
        n => Err(ToolError::invalid_arguments(format!(
            "`max_bytes` is {n}, expected at most {MAX_BYTES}"
        ))),
    }
}

/// The request's headers with every secret as a handle: `auth` as the
/// `authorization` header, `{{secret:NAME}}` in values expanded.
fn with_secrets(
    headers: &BTreeMap<String, String>,
    auth: Option<&Auth>,
) -> Result<Vec<(String, String)>, ToolError> {
    let mut out = Vec::with_capacity(headers.len() + 1);
    if let Some(auth) = auth {
        let form = match (&auth.scheme, &auth.username) {
            (AuthScheme::Bearer, None) => SecretForm::Bearer,
            (AuthScheme::Basic, Some(user)) => SecretForm::Basic(user.clone()),
            (AuthScheme::Bearer, Some(_)) => {
                return Err(ToolError::invalid_arguments(
                    "`auth.username` goes with `\"scheme\": \"basic\"` only",
                ));
            }
            (AuthScheme::Basic, None) => {
                return Err(ToolError::invalid_arguments(
                    "`auth` with `\"scheme\": \"basic\"` needs a `username`",
                ));
            }
        };
        let handle = secrets::handle(&auth.secret, form).map_err(secret_error)?;
        out.push(("authorization".to_owned(), handle.into()));
    }
    for (name, value) in headers {
        if auth.is_some() && name.eq_ignore_ascii_case("authorization") {
            return Err(ToolError::invalid_arguments(
                "`auth` and an `authorization` header cannot both be given",
            ));
        }
        out.push((name.clone(), secrets::expand(value).map_err(secret_error)?));
    }
    Ok(out)
}

fn secret_error(e: SecretError) -> ToolError {
    match e {
        SecretError::InvalidForm(m) => ToolError::invalid_arguments(m),
        SecretError::NotGranted(m) | SecretError::RevealDenied(m) => ToolError::denied(m),
    }
}

fn is_credential(header: &str) -> bool {
    ["authorization", "cookie", "proxy-authorization"]
        .iter()
        .any(|h| header.eq_ignore_ascii_case(h))
}

fn send<'a>(
    method: &str,
    url: &Url,
    headers: impl Iterator<Item = &'a (String, String)>,
    body: Vec<u8>,
    max_bytes: usize,
) -> Result<Response, ToolError> {
    let timeout = warden_guest::config("timeout_ms")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(DEFAULT_TIMEOUT_MS);
    let mut request = Request::new(method, url.to_string())
        .body(body)
        .timeout(Duration::from_millis(timeout))
        .max_response_bytes(max_bytes);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    http::send(&request).map_err(tool_error)
}

fn output(url: &Url, response: Response, redirects: Vec<String>) -> HttpOutput {
    let extra = warden_guest::config("response_headers").unwrap_or_default();
    let wanted: Vec<String> = SELECTED_HEADERS
        .iter()
        .map(|h| h.to_string())
        .chain(
            extra
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty()),
        )
        .collect();
    let mut headers = BTreeMap::new();
    for (name, value) in &response.headers {
        let name = name.to_ascii_lowercase();
        if wanted.contains(&name) {
            headers.entry(name).or_insert_with(|| value.clone());
        }
    }
    HttpOutput {
        url: url.to_string(),
        status: response.status,
        headers,
        body_bytes: response.body.len(),
        body: String::from_utf8_lossy(&response.body).into_owned(),
        truncated: response.truncated,
        redirects,
    }
}

/// The tool error for an HTTP error.
pub fn tool_error(e: HttpError) -> ToolError {
    let message = e.to_string();
    match e {
        HttpError::Denied { .. } => ToolError::denied(message),
        HttpError::InvalidUrl { .. } | HttpError::InvalidRequest { .. } => {
            ToolError::invalid_arguments(message)
        }
        HttpError::TooLarge { .. } => ToolError::failed(message),
        _ if e.is_retryable() => ToolError::retryable(message),
        _ => ToolError::failed(message),
    }
}

/// The plugin as the component exports it.
pub struct HttpPlugin;

impl ToolPlugin for HttpPlugin {
    fn toolbox() -> Toolbox {
        toolbox()
    }
}

warden_guest::export_tool_plugin!(HttpPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::cell::RefCell;
    use std::rc::Rc;
    use warden_guest::testing::{call, clear_config, set_config, set_http};

    fn invoke(tool: &str, args: Value) -> Result<HttpOutput, ToolError> {
        toolbox()
            .invoke(&call(tool, args))
            .map(|out| serde_json::from_str(&out.content).unwrap())
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            truncated: false,
        }
    }

    #[test]
    fn describes_a_read_tool_and_a_write_tool() {
        let specs = toolbox().describe();
        let names: Vec<(&str, Effect)> =
            specs.iter().map(|s| (s.name.as_str(), s.effect)).collect();
        assert_eq!(
            names,
            [("http_get", Effect::Read), ("http_request", Effect::Write)]
        );
        for spec in &specs {
            let schema: Value = serde_json::from_str(&spec.input_schema).unwrap();
            for (field, property) in schema["properties"].as_object().unwrap() {
                let d = property["description"].as_str().unwrap_or_default();
                assert!(!d.is_empty() && !d.contains('\n'), "{}.{field}", spec.name);
            }
        }
    }

    #[test]
    fn get_returns_status_selected_headers_and_body() {
        clear_config();
        set_config("response_headers", "X-Request-Id");
        let seen = Rc::new(RefCell::new(Vec::new()));
        let log = Rc::clone(&seen);
        set_http(move |r| {
            log.borrow_mut()
                .push((r.method.clone(), r.url.clone(), r.timeout));
            Ok(response(
                200,
                &[
                    ("Content-Type", "text/plain"),
                    ("x-request-id", "7"),
                    ("set-cookie", "s=1"),
                ],
                "hello",
            ))
        });
        let out = invoke("http_get", json!({"url": "https://api.example.com/a?b=1"})).unwrap();
        assert_eq!(out.status, 200);
        assert_eq!(out.body, "hello");
        assert_eq!(
            out.headers,
            BTreeMap::from([
                ("content-type".into(), "text/plain".into()),
                ("x-request-id".into(), "7".into())
            ])
        );
        assert_eq!(
            seen.borrow()[0],
            (
                "GET".to_string(),
                "https://api.example.com/a?b=1".to_string(),
                Some(Duration::from_millis(DEFAULT_TIMEOUT_MS))
            )
        );
    }

    #[test]
    fn get_follows_redirects_and_drops_credentials_across_hosts() {
        clear_config();
        let seen = Rc::new(RefCell::new(Vec::new()));
        let log = Rc::clone(&seen);
        set_http(move |r| {
            log.borrow_mut().push((r.url.clone(), r.headers.clone()));
            Ok(match r.url.as_str() {
                "http://a.example/start" => response(302, &[("location", "/next")], ""),
                "http://a.example/next" => {
                    response(301, &[("location", "https://b.example/end")], "")
                }
                _ => response(200, &[], "done"),
            })
        });
        let out = invoke(
            "http_get",
            json!({"url": "http://a.example/start", "headers": {"Authorization": "Bearer t", "accept": "*/*"}}),
        )
        .unwrap();
        assert_eq!(out.url, "https://b.example/end");
        assert_eq!(
            out.redirects,
            ["http://a.example/start", "http://a.example/next"]
        );
        let seen = seen.borrow();
        assert_eq!(seen.len(), 3);
        assert!(seen[1].1.iter().any(|(n, _)| n == "Authorization"));
        assert_eq!(seen[2].1, [("accept".to_string(), "*/*".to_string())]);
    }

    #[test]
    fn secrets_go_by_handle_never_by_value() {
        use warden_guest::testing::{clear_secrets, set_secret};
        clear_secrets();
        set_secret("api", "v4lue-never-seen", false);
        let seen = Rc::new(RefCell::new(Vec::new()));
        let log = Rc::clone(&seen);
        set_http(move |r| {
            log.borrow_mut().push(r.headers.clone());
            Ok(response(200, &[], "ok"))
        });
        invoke(
            "http_get",
            json!({"url": "http://a.example/", "auth": {"secret": "api"},
                   "headers": {"x-key": "k={{secret:api}}"}}),
        )
        .unwrap();
        invoke(
            "http_request",
            json!({"method": "POST", "url": "http://a.example/",
                   "auth": {"secret": "api", "scheme": "basic", "username": "me"}}),
        )
        .unwrap();
        let seen = seen.borrow();
        assert_eq!(
            seen[0],
            [
                (
                    "authorization".to_string(),
                    "{{secret:api:bearer}}".to_string()
                ),
                ("x-key".to_string(), "k={{secret:api:plain}}".to_string())
            ]
        );
        assert_eq!(
            seen[1],
            [(
                "authorization".to_string(),
                "{{secret:api:basic:me}}".to_string()
            )]
        );
        let denied = invoke(
            "http_get",
            json!({"url": "http://a.example/", "auth": {"secret": "other"}}),
        )
        .unwrap_err();
        assert!(
            matches!(denied, ToolError::Denied(ref m) if m.contains("`other`")),
            "{denied:?}"
        );
        let both = invoke(
            "http_get",
            json!({"url": "http://a.example/", "auth": {"secret": "api"}, "headers": {"Authorization": "x"}}),
        )
        .unwrap_err();
        assert!(matches!(both, ToolError::InvalidArguments(_)), "{both:?}");
    }

    #[test]
    fn redirects_stop_at_the_limit() {
        set_http(|_| Ok(response(302, &[("location", "/again")], "")));
        let out = invoke(
            "http_get",
            json!({"url": "http://a.example/", "max_redirects": 2}),
        )
        .unwrap();
        assert_eq!(out.status, 302);
        assert_eq!(out.redirects.len(), 2);
    }

    #[test]
    fn errors_map_onto_tool_errors() {
        set_http(|r| {
            let host = Url::parse(&r.url).unwrap().host_port();
            Err(match r.url.as_str() {
                "http://denied.example/" => HttpError::Denied {
                    host,
                    reason: "not among the hosts granted to this plugin".into(),
                },
                _ => HttpError::Timeout { host },
            })
        });
        let denied = invoke("http_get", json!({"url": "http://denied.example/"})).unwrap_err();
        assert_eq!(
            denied,
            ToolError::denied(
                "request to `denied.example:80` denied: not among the hosts granted to this plugin"
            )
        );
        let slow = invoke("http_get", json!({"url": "http://slow.example/"})).unwrap_err();
        assert!(
            matches!(slow, ToolError::Failed(ref f) if f.retryable),
            "{slow:?}"
        );
        for (tool, args, needle) in [
            ("http_get", json!({"url": "ftp://x/"}), "scheme"),
            (
                "http_get",
                json!({"url": "http://x/", "method": "POST"}),
                "http_request",
            ),
            (
                "http_get",
                json!({"url": "http://x/", "max_bytes": 5_000_000}),
                "max_bytes",
            ),
            (
                "http_request",
                json!({"url": "http://x/", "method": "P O"}),
                "method",
            ),
            (
                "http_request",
                json!({"url": "http://u@x/", "method": "POST"}),
                "user info",
            ),
        ] {
            match invoke(tool, args.clone()) {
                Err(ToolError::InvalidArguments(m)) => assert!(m.contains(needle), "{args}: {m}"),
                other => panic!("{args}: {other:?}"),
            }
        }
    }

    #[test]
    fn request_sends_the_body_and_previews_without_sending() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let log = Rc::clone(&seen);
        set_http(move |r| {
            log.borrow_mut().push((r.method.clone(), r.body.clone()));
            Ok(response(201, &[], "{\"id\":1}"))
        });
        let args = json!({"method": "post", "url": "http://api.example/items", "body": "{\"a\":1}", "headers": {"content-type": "application/json"}});
        let preview = toolbox()
            .preflight(&call("http_request", args.clone()))
            .unwrap();
        assert_eq!(
            preview.summary,
            "POST http://api.example/items (7 bytes of body)"
        );
        assert_eq!(
            preview.detail,
            "content-type: application/json\n\n{\"a\":1}"
        );
        assert!(seen.borrow().is_empty());
        let out = invoke("http_request", args).unwrap();
        assert_eq!(out.status, 201);
        assert_eq!(
            seen.borrow()[0],
            ("POST".to_string(), b"{\"a\":1}".to_vec())
        );
    }
}
