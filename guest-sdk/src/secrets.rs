//! Secrets the operator granted this plugin, used by handle: the plugin
//! never holds the value.
//!
//! A [`Handle`] is a placeholder text that stands for one secret in one
//! [`SecretForm`]. Put it in an outgoing request's header, as the whole
//! value or part of it; the host fills the secret in after the request
//! leaves the plugin, and only when the request goes to one of the hosts
//! the operator bound the secret to. For any other host (a redirect, a
//! mistake) the host removes the header instead.
//!
//! ```no_run
//! use warden_guest::http::{self, Request};
//! use warden_guest::secrets::{self, SecretForm};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = secrets::handle("api_token", SecretForm::Bearer)?;
//! let response = http::send(
//!     &Request::get("https://api.example.com/v1/items").header("authorization", token),
//! )?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! Only a secret granted with `reveal = true` can be read with [`reveal`];
//! for any other the host answers [`SecretError::RevealDenied`].
//!
//! Natively (unit tests), the secrets are the ones set with
//! [`testing::set_secret`](crate::testing::set_secret), and a handle is the
//! readable text `{{secret:NAME:FORM}}`, so a test can see which secret
//! went into which header.

use std::fmt;

/// How the host writes a secret into a header value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretForm {
    /// The value as it is.
    Plain,
    /// `Bearer <value>`.
    Bearer,
    /// `Basic <base64 of "username:value">`, with this username.
    Basic(String),
}

/// A placeholder standing for a secret in one form, valid in this call
/// only. Use it as a header value or inside one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle(String);

impl Handle {
    /// The placeholder text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Handle> for String {
    fn from(handle: Handle) -> String {
        handle.0
    }
}

/// Why the host refused a secret. Each message names the secret and what
/// the operator can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// No secret of that name is granted to this plugin.
    NotGranted(String),
    /// The secret is granted for use by handle only.
    RevealDenied(String),
    /// The form cannot be made (a basic-auth username with a `:`).
    InvalidForm(String),
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::NotGranted(m)
            | SecretError::RevealDenied(m)
            | SecretError::InvalidForm(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SecretError {}

/// A handle to the secret `name` in `form`.
pub fn handle(name: &str, form: SecretForm) -> Result<Handle, SecretError> {
    imp::handle(name, form).map(Handle)
}

/// The value of the secret `name`: only for a secret granted with
/// `reveal = true`. A plugin that reads a secret can leak it in ways no
/// redaction catches; prefer [`handle`].
pub fn reveal(name: &str) -> Result<String, SecretError> {
    imp::reveal(name)
}

/// `text` with each `{{secret:NAME}}` replaced by a plain handle to the
/// secret `NAME`: for header templates such as `token={{secret:api}};v=2`
/// that an operator or a model writes.
pub fn expand(text: &str) -> Result<String, SecretError> {
    const OPEN: &str = "{{secret:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find("}}") else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(handle(&after[..end], SecretForm::Plain)?.as_str());
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{SecretError, SecretForm};
    use crate::bindings::warden::plugin::secrets as wit;

    fn error(e: wit::SecretError) -> SecretError {
        match e {
            wit::SecretError::NotGranted(m) => SecretError::NotGranted(m),
            wit::SecretError::RevealDenied(m) => SecretError::RevealDenied(m),
            wit::SecretError::InvalidForm(m) => SecretError::InvalidForm(m),
        }
    }

    pub(super) fn handle(name: &str, form: SecretForm) -> Result<String, SecretError> {
        let form = match form {
            SecretForm::Plain => wit::SecretForm::Plain,
            SecretForm::Bearer => wit::SecretForm::Bearer,
            SecretForm::Basic(user) => wit::SecretForm::Basic(user),
        };
        wit::handle(name, &form).map_err(error)
    }

    pub(super) fn reveal(name: &str) -> Result<String, SecretError> {
        wit::reveal(name).map_err(error)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    pub(super) use crate::testing::{native_handle as handle, native_reveal as reveal};
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::testing::{clear_secrets, set_secret};

    #[test]
    fn handles_and_reveals_follow_the_grant() {
        clear_secrets();
        set_secret("api", "v4lue", false);
        set_secret("open", "readable", true);
        assert_eq!(
            handle("api", SecretForm::Bearer).unwrap().as_str(),
            "{{secret:api:bearer}}"
        );
        assert!(matches!(reveal("api"), Err(SecretError::RevealDenied(_))));
        assert_eq!(reveal("open").unwrap(), "readable");
        assert!(matches!(
            handle("nope", SecretForm::Plain),
            Err(SecretError::NotGranted(m)) if m.contains("`nope`")
        ));
        assert_eq!(
            expand("k={{secret:api}};v=2").unwrap(),
            "k={{secret:api:plain}};v=2"
        );
        assert!(expand("{{secret:nope}}").is_err());
        assert_eq!(expand("no {{secret:").unwrap(), "no {{secret:");
    }
}
