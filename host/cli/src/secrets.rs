//! `warden secrets keygen|set|list|rotate|remove`: the encrypted secrets
//! file grants name as `store = "<name>"` (`warden::plugins::secret_store`).
//! A value is read from stdin, never from the command line (which other
//! users can see in the process list), and no command prints one.

use std::io::Read;
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::errors::CliError;
use warden::plugins::secret_store::{SecretStore, SecretStoreError, generate_key};

#[derive(Debug, Subcommand)]
pub(crate) enum SecretsCommand {
    /// Write a new secrets key (32 random bytes, hex) to a file only its
    /// owner can read; point WARDEN_SECRETS_KEY_FILE at it. Refuses to
    /// overwrite a file.
    Keygen {
        /// The key file to create.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Add a secret, its value read from stdin (one trailing newline
    /// dropped). Refuses a name already set: use rotate.
    Set {
        /// The secret's name, as grants name it (`store = "<name>"`).
        name: String,
    },
    /// The secrets: name, version digest, when set and rotated. Never a
    /// value.
    List,
    /// Replace a secret's value, read from stdin. Runs loading it from now
    /// on use the new value; a call already recorded is never sent again.
    Rotate {
        /// The secret's name.
        name: String,
    },
    /// Remove a secret.
    Remove {
        /// The secret's name.
        name: String,
    },
}

pub(crate) async fn run(command: SecretsCommand, ctx: &Context) -> anyhow::Result<()> {
    if let SecretsCommand::Keygen { out } = &command {
        return keygen(out, ctx.json);
    }
    let store = SecretStore::from_env(&|k| std::env::var(k).ok()).map_err(cli_error)?;
    let now = now_ms();
    match command {
        SecretsCommand::Keygen { .. } => unreachable!("handled above"),
        SecretsCommand::Set { name } => {
            let value = stdin_value()?;
            store.set(&name, &value, now).map_err(cli_error)?;
            done(ctx.json, "set", &name, &store);
        }
        SecretsCommand::Rotate { name } => {
            let value = stdin_value()?;
            store.rotate(&name, &value, now).map_err(cli_error)?;
            done(ctx.json, "rotated", &name, &store);
        }
        SecretsCommand::Remove { name } => {
            store.remove(&name).map_err(cli_error)?;
            done(ctx.json, "removed", &name, &store);
        }
        SecretsCommand::List => {
            let list = store.list().map_err(cli_error)?;
            if ctx.json {
                println!("{}", json!({ "secrets": list }));
            } else if list.is_empty() {
                eprintln!("no secrets in {}", store.path().display());
            } else {
                for s in list {
                    println!(
                        "{}\t{}\trotations {}\tupdated {}",
                        s.name, s.version, s.rotations, s.updated_ms
                    );
                }
            }
        }
    }
    Ok(())
}

fn done(json: bool, what: &str, name: &str, store: &SecretStore) {
    if json {
        println!(
            "{}",
            json!({ what: name, "file": store.path().display().to_string() })
        );
    } else {
        eprintln!("secret `{name}` {what} in {}", store.path().display());
    }
}

fn keygen(out: &std::path::Path, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(out).map_err(|e| {
        CliError::new(
            "secrets_key_invalid",
            format!("cannot create key file `{}`: {e}", out.display()),
        )
    })?;
    file.write_all(generate_key().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| {
            CliError::new(
                "secrets_key_invalid",
                format!("cannot write key file `{}`: {e}", out.display()),
            )
        })?;
    if json {
        println!("{}", json!({ "key_file": out.display().to_string() }));
    } else {
        eprintln!(
            "wrote a secrets key to {}; set WARDEN_SECRETS_KEY_FILE={} and keep a copy somewhere safe: without it the secrets file cannot be read",
            out.display(),
            out.display()
        );
    }
    Ok(())
}

fn stdin_value() -> anyhow::Result<String> {
    let mut value = String::new();
    std::io::stdin()
        .take(64 << 10)
        .read_to_string(&mut value)
        .map_err(|e| CliError::new("usage", format!("cannot read the value from stdin: {e}")))?;
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        return Err(CliError::new(
            "usage",
            "no value on stdin: pipe it in, for example `warden secrets set NAME < token.txt`",
        )
        .into());
    }
    Ok(value)
}

fn cli_error(e: SecretStoreError) -> anyhow::Error {
    CliError::new(e.code(), e.to_string()).into()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
