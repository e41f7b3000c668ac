//! Tools: typed tool functions ([`Tool`]), the set a plugin offers
//! ([`Toolbox`]) with its native dispatch (`describe`, `preflight`,
//! `invoke` by tool name), the [`ToolPlugin`] trait the export macro binds to
//! the WIT `tool` interface, and the [`ToolError`] constructors.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::json;
use crate::types::{Call, Effect, Failure, Preview, ToolError, ToolOutput, ToolSpec};

/// Longest tool name the WIT contract allows, in bytes.
const MAX_TOOL_NAME: usize = 64;

/// A plugin that offers tools. Export it with
/// [`export_tool_plugin!`](crate::export_tool_plugin).
///
/// Each invocation runs in a fresh instance, so `toolbox` is called once per
/// `describe`, `preflight` or `invoke`: keep it cheap (build closures, do no
/// I/O).
pub trait ToolPlugin {
    /// The tools this plugin offers.
    fn toolbox() -> Toolbox;
}

type RunFn = Box<dyn Fn(&Call) -> Result<ToolOutput, ToolError>>;
type PreflightFn = Box<dyn Fn(&Call) -> Result<Preview, ToolError>>;

/// One tool: its name, description and effect class, the JSON Schema of its
/// arguments (derived from the argument type), a run function and an
/// optional preflight function.
///
/// By default a tool has no preflight function: its preview then checks the
/// arguments and shows them.
pub struct Tool {
    name: String,
    description: String,
    effect: Effect,
    schema: fn() -> String,
    check: fn(&Call) -> Result<(), ToolError>,
    run: RunFn,
    preflight: Option<PreflightFn>,
}

impl Tool {
    /// A tool named `name` whose arguments are an `A` and whose output is
    /// the JSON serialization of an `O`.
    ///
    /// `name` must match `[a-z][a-z0-9_]*` and be at most 64 bytes
    /// ([`Toolbox::tool`] checks). The input schema sent to the host is
    /// `schemars::schema_for!(A)`; add `#[serde(deny_unknown_fields)]` to `A`
    /// so that unknown arguments are refused and the schema says so. Blank
    /// arguments count as `{}`. Arguments that do not parse as an `A` are
    /// refused with [`ToolError::InvalidArguments`] carrying serde's reason
    /// and the field's path; `run` is not called. Doc
    /// comments on `A`'s fields become the schema's descriptions, which the
    /// model reads; schemars keeps their line breaks, so write each on one
    /// line.
    pub fn new<A, O, F>(
        name: impl Into<String>,
        description: impl Into<String>,
        effect: Effect,
        run: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + 'static,
        O: Serialize,
        F: Fn(A, &Call) -> Result<O, ToolError> + 'static,
    {
        Tool {
            name: name.into(),
            description: description.into(),
            effect,
            schema: schema_json::<A>,
            check: check_arguments::<A>,
            run: Box::new(move |call| {
                let args = parse_arguments::<A>(call)?;
                let output = run(args, call)?;
                let content = serde_json::to_string(&output).map_err(|e| {
                    ToolError::failed(format!(
                        "cannot serialize the output of tool `{}`: {e}",
                        call.tool
                    ))
                })?;
                Ok(ToolOutput { content })
            }),
            preflight: None,
        }
    }

    /// Sets the preflight function: a side-effect-free preview of what `run`
    /// would do with these arguments, shown to the human who approves the
    /// call. It parses the arguments as a `P`, normally the same type as
    /// `run`'s. Default: no preflight function.
    pub fn with_preflight<P, F>(mut self, preflight: F) -> Self
    where
        P: DeserializeOwned + 'static,
        F: Fn(P, &Call) -> Result<Preview, ToolError> + 'static,
    {
        self.preflight = Some(Box::new(move |call| {
            let args = parse_arguments::<P>(call)?;
            preflight(args, call)
        }));
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tool's effect class.
    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// What `describe` reports for this tool, schema included.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: (self.schema)(),
            effect: self.effect,
        }
    }

    /// Runs the preflight function, or, without one, checks the arguments and
    /// returns a preview that names the tool and shows the arguments.
    pub fn preflight(&self, call: &Call) -> Result<Preview, ToolError> {
        if let Some(preflight) = &self.preflight {
            return preflight(call);
        }
        (self.check)(call)?;
        let detail = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|value| serde_json::to_string_pretty(&value).ok())
            .unwrap_or_else(|| call.arguments.clone());
        Ok(Preview::new(
            format!("call `{}` ({})", self.name, self.effect),
            detail,
        ))
    }

    /// Parses the arguments and runs the tool.
    pub fn invoke(&self, call: &Call) -> Result<ToolOutput, ToolError> {
        (self.run)(call)
    }
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("effect", &self.effect)
            .field("preflight", &self.preflight.is_some())
            .finish_non_exhaustive()
    }
}

fn schema_json<A: JsonSchema>() -> String {
    let schema = schemars::generate::SchemaSettings::default()
        .with_transform(StandardFormats)
        .into_generator()
        .into_root_schema_for::<A>();
    serde_json::to_string(&schema).expect("a json schema serializes")
}

/// Drops the `format` schemars gives Rust's number types (`uint64`,
/// `int32`, `double`, …): they are not JSON Schema formats, and strict
/// validators (Ajv, as MCP clients use) refuse a schema naming a format
/// they do not know. What they said stays said by `minimum` and `maximum`
/// (schemars sets them for unsigned and small types; an unsigned type
/// without one gets `minimum: 0`).
#[derive(Clone, Copy)]
struct StandardFormats;

impl schemars::transform::Transform for StandardFormats {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        if let Some(object) = schema.as_object_mut() {
            let rust = object
                .get("format")
                .and_then(serde_json::Value::as_str)
                .filter(|f| is_rust_number_format(f))
                .map(str::to_owned);
            if let Some(format) = rust {
                object.remove("format");
                if format.starts_with("uint") && !object.contains_key("minimum") {
                    object.insert("minimum".into(), 0.into());
                }
            }
        }
        schemars::transform::transform_subschemas(self, schema);
    }
}

/// Whether `format` is one schemars names a Rust number type by.
fn is_rust_number_format(format: &str) -> bool {
    matches!(format, "float" | "double")
        || ["int", "uint"].iter().any(|prefix| {
            format
                .strip_prefix(prefix)
                .is_some_and(|bits| matches!(bits, "" | "8" | "16" | "32" | "64" | "128"))
        })
}

fn parse_arguments<A: DeserializeOwned>(call: &Call) -> Result<A, ToolError> {
    json::parse(&call.arguments).map_err(|reason| {
        ToolError::invalid_arguments(format!(
            "invalid arguments for tool `{}`: {reason}",
            call.tool
        ))
    })
}

fn check_arguments<A: DeserializeOwned>(call: &Call) -> Result<(), ToolError> {
    parse_arguments::<A>(call).map(|_: A| ())
}

/// The tools a plugin offers, and dispatch by tool name.
///
/// By default a toolbox is empty. Dispatch works the same natively and in
/// the component, so plugin logic is unit-tested with plain `cargo test`:
///
/// ```
/// use warden_guest::{Effect, Tool, Toolbox, testing};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Add { a: i64, b: i64 }
///
/// let toolbox = Toolbox::new().tool(Tool::new(
///     "add", "Adds two numbers", Effect::Read,
///     |args: Add, _call| Ok(args.a + args.b),
/// ));
/// let output = toolbox.invoke(&testing::call("add", serde_json::json!({"a": 2, "b": 3})));
/// assert_eq!(output.unwrap().content, "5");
/// ```
#[derive(Debug, Default)]
pub struct Toolbox {
    tools: Vec<Tool>,
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Self {
        Toolbox::default()
    }

    /// Adds `tool`.
    ///
    /// # Panics
    /// If the tool's name does not match `[a-z][a-z0-9_]*`, is longer than 64
    /// bytes, or is already taken: these are bugs in the plugin, which its
    /// first unit test of `describe` finds.
    pub fn tool(mut self, tool: Tool) -> Self {
        if let Err(reason) = check_tool_name(&tool.name) {
            panic!("{reason}");
        }
        if self.get(&tool.name).is_some() {
            panic!("tool name `{}` is used twice", tool.name);
        }
        self.tools.push(tool);
        self
    }

    /// The tool named `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|tool| tool.name == name)
    }

    /// The tools, in the order they were added.
    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter()
    }

    /// The specs of all tools, for the WIT `describe`.
    pub fn describe(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(Tool::spec).collect()
    }

    /// Previews `call` with the tool it names, for the WIT `preflight`.
    pub fn preflight(&self, call: &Call) -> Result<Preview, ToolError> {
        self.find(call)?.preflight(call)
    }

    /// Runs `call` with the tool it names, for the WIT `invoke`. A call of a
    /// tool this toolbox lacks is [`ToolError::InvalidArguments`], naming
    /// the tool and listing the known ones (as for `preflight`).
    pub fn invoke(&self, call: &Call) -> Result<ToolOutput, ToolError> {
        self.find(call)?.invoke(call)
    }

    fn find(&self, call: &Call) -> Result<&Tool, ToolError> {
        self.get(&call.tool).ok_or_else(|| {
            let known: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
            ToolError::invalid_arguments(format!(
                "unknown tool `{}`; this plugin offers: {}",
                call.tool,
                known.join(", ")
            ))
        })
    }
}

fn check_tool_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !well_formed {
        return Err(format!("tool name `{name}` must match [a-z][a-z0-9_]*"));
    }
    if name.len() > MAX_TOOL_NAME {
        return Err(format!(
            "tool name `{name}` is {} bytes, more than {MAX_TOOL_NAME}",
            name.len()
        ));
    }
    Ok(())
}

impl ToolError {
    /// The arguments do not fit the tool's schema or meaning.
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        ToolError::InvalidArguments(message.into())
    }

    /// The tool refused: outside its mount, not permitted, and so on.
    pub fn denied(message: impl Into<String>) -> Self {
        ToolError::Denied(message.into())
    }

    /// The tool tried and failed; trying again will not help.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed(Failure::new(message, false))
    }

    /// The tool tried and failed; trying again later may succeed.
    pub fn retryable(message: impl Into<String>) -> Self {
        ToolError::Failed(Failure::new(message, true))
    }

    /// The error's message, whatever its variant.
    pub fn message(&self) -> &str {
        match self {
            ToolError::InvalidArguments(message) | ToolError::Denied(message) => message,
            ToolError::Failed(failure) => &failure.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::call;
    use serde::Deserialize;
    use serde_json::{Value, json};
    use std::cell::Cell;
    use std::rc::Rc;

    /// Greets someone.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Greet {
        /// Who to greet.
        name: String,
        /// How many exclamation marks.
        #[serde(default)]
        excitement: u8,
    }

    #[derive(Serialize)]
    struct Greeting {
        text: String,
    }

    fn greet(args: Greet, _call: &Call) -> Result<Greeting, ToolError> {
        if args.name.is_empty() {
            return Err(ToolError::invalid_arguments("`name` is empty"));
        }
        Ok(Greeting {
            text: format!("hello {}{}", args.name, "!".repeat(args.excitement.into())),
        })
    }

    fn toolbox() -> Toolbox {
        Toolbox::new()
            .tool(Tool::new("greet", "Greets someone", Effect::Read, greet))
            .tool(
                Tool::new(
                    "set_motto",
                    "Sets the motto",
                    Effect::Write,
                    |args: Greet, call: &Call| Ok(format!("{} by {}", args.name, call.id)),
                )
                .with_preflight(|args: Greet, _call: &Call| {
                    Ok(Preview::new(format!("set motto to {:?}", args.name), ""))
                }),
            )
    }

    #[test]
    fn describe_reports_names_effects_and_derived_schemas() {
        let specs = toolbox().describe();
        let names: Vec<(&str, Effect)> =
            specs.iter().map(|s| (s.name.as_str(), s.effect)).collect();
        assert_eq!(
            names,
            [("greet", Effect::Read), ("set_motto", Effect::Write)]
        );
        let schema: Value = serde_json::from_str(&specs[0].input_schema).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["name"]));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["name"]["description"], "Who to greet.");
        assert_eq!(specs[0].description, "Greets someone");
    }

    #[test]
    fn number_schemas_name_no_format_json_schema_does_not_have() {
        /// Arguments of every number type.
        #[derive(serde::Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Numbers {
            a: u64,
            b: usize,
            c: i32,
            d: f64,
            e: Option<u8>,
            f: Vec<u32>,
            when: String,
        }
        let schema: Value = serde_json::from_str(&schema_json::<Numbers>()).unwrap();
        let text = schema.to_string();
        assert!(!text.contains("\"format\""), "{schema:#}");
        assert_eq!(schema["properties"]["a"]["minimum"], 0, "{schema:#}");
        assert_eq!(schema["properties"]["b"]["minimum"], 0, "{schema:#}");
        assert_eq!(
            schema["properties"]["f"]["items"]["minimum"], 0,
            "{schema:#}"
        );
        assert!(is_rust_number_format("uint64") && is_rust_number_format("double"));
        for standard in ["date-time", "uri", "email", "uuid", "integer", "int256"] {
            assert!(!is_rust_number_format(standard), "{standard}");
        }
    }

    #[test]
    fn invoke_serializes_the_output_as_json_text() {
        let output = toolbox()
            .invoke(&call("greet", json!({"name": "ada", "excitement": 2})))
            .unwrap();
        assert_eq!(output.content, r#"{"text":"hello ada!!"}"#);
    }

    #[test]
    fn invoke_passes_the_call_to_the_run_function() {
        let mut c = call("set_motto", json!({"name": "onward"}));
        c.id = "call-7".into();
        assert_eq!(
            toolbox().invoke(&c).unwrap().content,
            r#""onward by call-7""#
        );
    }

    #[test]
    fn mismatched_arguments_are_invalid_arguments_naming_the_field() {
        let cases = [
            (
                json!({}),
                "invalid arguments for tool `greet`: missing field `name`",
            ),
            (
                json!({"name": "ada", "excitement": "lots"}),
                "invalid arguments for tool `greet`: field `excitement`: invalid type: string \"lots\"",
            ),
            (
                json!({"name": "ada", "loud": true}),
                "invalid arguments for tool `greet`: unknown field `loud`",
            ),
        ];
        for (args, expected) in cases {
            match toolbox().invoke(&call("greet", args.clone())) {
                Err(ToolError::InvalidArguments(message)) => {
                    assert!(message.starts_with(expected), "{args}: {message}")
                }
                other => panic!("{args}: expected invalid-arguments, got {other:?}"),
            }
        }
    }

    #[test]
    fn errors_from_the_run_function_pass_through() {
        let err = toolbox()
            .invoke(&call("greet", json!({"name": ""})))
            .unwrap_err();
        assert_eq!(err, ToolError::invalid_arguments("`name` is empty"));
    }

    #[test]
    fn unknown_tools_are_named_with_the_known_ones() {
        let err = toolbox().invoke(&call("nope", json!({}))).unwrap_err();
        assert_eq!(
            err,
            ToolError::invalid_arguments(
                "unknown tool `nope`; this plugin offers: greet, set_motto"
            )
        );
        assert_eq!(toolbox().preflight(&call("nope", json!({}))), Err(err));
    }

    #[test]
    fn preflight_uses_the_preflight_function_without_running_the_tool() {
        let runs = Rc::new(Cell::new(0));
        let counter = runs.clone();
        let toolbox = Toolbox::new().tool(
            Tool::new(
                "touch",
                "Touches",
                Effect::Write,
                move |_: Greet, _: &Call| {
                    counter.set(counter.get() + 1);
                    Ok(())
                },
            )
            .with_preflight(|args: Greet, _: &Call| Ok(Preview::new(args.name, "detail"))),
        );
        let preview = toolbox
            .preflight(&call("touch", json!({"name": "x"})))
            .unwrap();
        assert_eq!(preview, Preview::new("x", "detail"));
        assert_eq!(runs.get(), 0);
        assert_eq!(
            toolbox
                .invoke(&call("touch", json!({"name": "x"})))
                .unwrap()
                .content,
            "null"
        );
        assert_eq!(runs.get(), 1);
        let err = toolbox.preflight(&call("touch", json!({}))).unwrap_err();
        assert!(
            matches!(err, ToolError::InvalidArguments(m) if m.contains("missing field `name`"))
        );
    }

    #[test]
    fn default_preview_checks_and_shows_the_arguments() {
        let preview = toolbox()
            .preflight(&call("greet", json!({"name": "ada"})))
            .unwrap();
        assert_eq!(preview.summary, "call `greet` (read)");
        assert_eq!(preview.detail, "{\n  \"name\": \"ada\"\n}");
        let err = toolbox()
            .preflight(&call("greet", json!({"name": 3})))
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments(m) if m.contains("field `name`")));
    }

    #[test]
    fn tool_names_are_checked() {
        for bad in ["", "Greet", "1st", "has-dash", "has space", &"a".repeat(65)] {
            assert!(check_tool_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "read_file", "v2", &"a".repeat(64)] {
            assert_eq!(check_tool_name(good), Ok(()), "{good:?} refused");
        }
        assert_eq!(
            check_tool_name("Read"),
            Err("tool name `Read` must match [a-z][a-z0-9_]*".to_string())
        );
    }

    #[test]
    #[should_panic(expected = "tool name `greet` is used twice")]
    fn duplicate_tool_names_panic() {
        let _ = toolbox().tool(Tool::new("greet", "again", Effect::Read, greet));
    }

    #[test]
    fn error_constructors_pick_the_variant() {
        assert_eq!(ToolError::denied("no").message(), "no");
        assert_eq!(
            ToolError::retryable("busy"),
            ToolError::Failed(Failure::new("busy", true))
        );
        assert_eq!(
            ToolError::failed("broke"),
            ToolError::Failed(Failure::new("broke", false))
        );
    }
}
