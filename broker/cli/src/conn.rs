//! Connection flags and their resolution (SPEC §7.2): per field, flag > `NARAD_ADDR` /
//! `NARAD_USER` / `NARAD_PASS` > selected context > `http://127.0.0.1:7942`.

use narad_api::Client;

use crate::ctx::{self, ContextFile};

/// The default server address.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7942";

/// Connection flags, accepted by every client command (before or after its subcommand).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnArgs {
    /// Server URL [env: NARAD_ADDR] [default: http://127.0.0.1:7942]
    #[arg(
        long,
        short = 's',
        global = true,
        value_name = "URL",
        help_heading = "Connection"
    )]
    pub server: Option<String>,
    /// Username [env: NARAD_USER]
    #[arg(long, short = 'u', global = true, help_heading = "Connection")]
    pub user: Option<String>,
    /// Password [env: NARAD_PASS]
    #[arg(long, short = 'p', global = true, help_heading = "Connection")]
    pub password: Option<String>,
    /// PEM CA certificates that an https server's certificate may chain to, besides the
    /// system's roots [env: NARAD_CA_FILE]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// Resolved connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conn {
    pub server: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// CA file for https (flag > `NARAD_CA_FILE`).
    pub ca_file: Option<std::path::PathBuf>,
}

/// Resolves each field independently: flag > environment > selected context > default.
/// Empty environment values count as unset.
pub fn resolve(args: &ConnArgs, env: &dyn Fn(&str) -> Option<String>, ctxs: &ContextFile) -> Conn {
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    let sel = ctxs.selected().map(|(_, c)| c);
    Conn {
        server: args
            .server
            .clone()
            .or_else(|| env("NARAD_ADDR"))
            .or_else(|| sel.map(|c| c.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string()),
        user: args
            .user
            .clone()
            .or_else(|| env("NARAD_USER"))
            .or_else(|| sel.and_then(|c| c.user.clone())),
        password: args
            .password
            .clone()
            .or_else(|| env("NARAD_PASS"))
            .or_else(|| sel.and_then(|c| c.password.clone())),
        ca_file: args
            .ca_file
            .clone()
            .or_else(|| env("NARAD_CA_FILE").map(Into::into)),
    }
}

impl Conn {
    /// Builds the client. Credentials are sent when a username is set.
    pub fn client(&self) -> anyhow::Result<Client> {
        let auth = self
            .user
            .clone()
            .filter(|u| !u.is_empty())
            .map(|u| (u, self.password.clone().unwrap_or_default()));
        let ca = match &self.ca_file {
            Some(p) => Some(
                std::fs::read(p).map_err(|e| anyhow::anyhow!("CA file {}: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(Client::with_ca(&self.server, auth, ca.as_deref())?)
    }
}

/// Resolves the flags against this process's environment and contexts file.
pub fn resolve_env(args: &ConnArgs) -> anyhow::Result<Conn> {
    let env = |k: &str| std::env::var(k).ok();
    // The contexts file matters only for fields not given by flag or environment.
    let need_ctx = [
        (&args.server, "NARAD_ADDR"),
        (&args.user, "NARAD_USER"),
        (&args.password, "NARAD_PASS"),
    ]
    .iter()
    .any(|(flag, var)| flag.is_none() && env(var).filter(|v| !v.is_empty()).is_none());
    let ctxs = if need_ctx {
        ctx::load(&ctx::contexts_path()?)?
    } else {
        ContextFile::default()
    };
    Ok(resolve(args, &env, &ctxs))
}

/// Resolves and builds the client.
pub fn connect(args: &ConnArgs) -> anyhow::Result<Client> {
    resolve_env(args)?.client()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Context;

    fn ctxs(selected: bool) -> ContextFile {
        let mut f = ContextFile::default();
        f.contexts.insert(
            "prod".into(),
            Context {
                server: "http://ctx:1".into(),
                user: Some("ctxuser".into()),
                password: Some("ctxpass".into()),
            },
        );
        if selected {
            f.current = Some("prod".into());
        }
        f
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults() {
        let c = resolve(&ConnArgs::default(), &env_of(&[]), &ContextFile::default());
        assert_eq!(c.server, DEFAULT_SERVER);
        assert_eq!(c.user, None);
        assert_eq!(c.password, None);
        // An unselected context is ignored.
        let c = resolve(&ConnArgs::default(), &env_of(&[]), &ctxs(false));
        assert_eq!(c.server, DEFAULT_SERVER);
    }

    #[test]
    fn context_then_env_then_flag() {
        let c = resolve(&ConnArgs::default(), &env_of(&[]), &ctxs(true));
        assert_eq!(c.server, "http://ctx:1");
        assert_eq!(c.user.as_deref(), Some("ctxuser"));
        assert_eq!(c.password.as_deref(), Some("ctxpass"));

        let env = env_of(&[
            ("NARAD_ADDR", "http://env:2"),
            ("NARAD_PASS", "envpass"),
            ("NARAD_USER", ""),
        ]);
        let c = resolve(&ConnArgs::default(), &env, &ctxs(true));
        assert_eq!(c.server, "http://env:2");
        assert_eq!(c.user.as_deref(), Some("ctxuser"), "empty env is unset");
        assert_eq!(c.password.as_deref(), Some("envpass"));

        let flags = ConnArgs {
            server: Some("http://flag:3".into()),
            user: None,
            password: Some("flagpass".into()),
            ca_file: None,
        };
        let c = resolve(&flags, &env, &ctxs(true));
        assert_eq!(c.server, "http://flag:3");
        assert_eq!(c.user.as_deref(), Some("ctxuser"));
        assert_eq!(c.password.as_deref(), Some("flagpass"));
    }

    #[test]
    fn client_builds() {
        let c = Conn {
            server: "localhost:7942".into(),
            user: Some("u".into()),
            password: None,
            ca_file: None,
        }
        .client()
        .unwrap();
        assert_eq!(c.base_url(), "http://localhost:7942");
        assert_eq!(c.username(), Some("u"));
        let bad = Conn {
            server: "ftp://x".into(),
            user: None,
            password: None,
            ca_file: None,
        };
        assert!(bad.client().is_err());
    }
}
