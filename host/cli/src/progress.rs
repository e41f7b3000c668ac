//! Progress for long work, on stderr and only when stderr is a terminal:
//! a spinner line naming what is going on (compiling a plugin's component
//! the first time, waiting on the model), cleared when the work ends. Never
//! on stdout, so `--json` output stays clean.
//!
//! Compilation is reported by the sandbox as a `tracing` span (target
//! `warden::progress`, name `compile`, field `plugin`); [`ProgressLayer`]
//! turns such spans into spinners, whatever the log filter says.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::span;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The target of spans that report progress.
pub(crate) const TARGET: &str = "warden::progress";

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// A spinner on stderr; dropping it clears its line.
pub(crate) struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Spinner {
    /// Starts a spinner saying `message`, or returns `None` when stderr is
    /// not a terminal.
    pub(crate) fn start(message: String) -> Option<Spinner> {
        if !std::io::stderr().is_terminal() || super::quiet() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let draw = move |frame: usize| {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{} {message}", FRAMES[frame % FRAMES.len()]);
            let _ = err.flush();
        };
        // The first frame is drawn now, so even short work is seen.
        draw(0);
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut frame = 1;
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    draw(frame);
                    frame += 1;
                }
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
            }
        });
        Some(Spinner {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Shows a spinner for every progress span while it is open. Install it
/// with a per-layer filter that lets only [`TARGET`] through, so the log
/// filter (`RUST_LOG`, `-v`) neither hides nor widens it.
pub(crate) struct ProgressLayer;

/// The spinner of one open span, kept in the span's extensions.
struct SpanSpinner(#[allow(dead_code)] Option<Spinner>);

/// Reads the `plugin` field of a span.
struct PluginField(Option<String>);

impl tracing::field::Visit for PluginField {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "plugin" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "plugin" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for ProgressLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().target() != TARGET {
            return;
        }
        let mut plugin = PluginField(None);
        attrs.record(&mut plugin);
        let message = match (attrs.metadata().name(), plugin.0) {
            ("compile", Some(p)) => {
                format!("compiling plugin `{p}` (first use; cached afterwards)")
            }
            (name, Some(p)) => format!("{name} `{p}`"),
            (name, None) => name.to_owned(),
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut()
                .insert(SpanSpinner(Spinner::start(message)));
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            // Dropping the spinner clears its line.
            span.extensions_mut().remove::<SpanSpinner>();
        }
    }
}
