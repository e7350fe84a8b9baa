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
    #[arg(
        long,
        short = 'p',
        global = true,
        conflicts_with = "password_stdin",
        help_heading = "Connection"
    )]
    pub password: Option<String>,
    /// Read the password from the first line of stdin (keeps it out of the process list
    /// and the shell history)
    #[arg(long, global = true, help_heading = "Connection")]
    pub password_stdin: bool,
    /// PEM CA certificates that an https server's certificate may chain to, besides the
    /// system's roots [env: NARAD_CA_FILE]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl ConnArgs {
    /// Whether any connection flag was given.
    pub fn is_empty(&self) -> bool {
        self.server.is_none()
            && self.user.is_none()
            && self.password.is_none()
            && !self.password_stdin
            && self.ca_file.is_none()
    }

    /// Takes each flag not given here from `leading` (the flags written before the
    /// subcommand, as in `narad -s URL topic ls`): the flag nearer the end wins.
    pub fn fill_from(&mut self, leading: &ConnArgs) {
        if self.password.is_none() && !self.password_stdin {
            self.password = leading.password.clone();
            self.password_stdin = leading.password_stdin;
        }
        self.server = self.server.take().or_else(|| leading.server.clone());
        self.user = self.user.take().or_else(|| leading.user.clone());
        self.ca_file = self.ca_file.take().or_else(|| leading.ca_file.clone());
    }

    /// Reads the password from `input` when `--password-stdin` is given: its first line,
    /// without the line end. An empty password is refused.
    pub fn read_password(&mut self, input: &mut dyn std::io::BufRead) -> anyhow::Result<()> {
        if !self.password_stdin {
            return Ok(());
        }
        self.password = Some(secret_line(input, "--password-stdin")?);
        self.password_stdin = false;
        Ok(())
    }
}

/// A secret given on stdin (`flag` names the option that asked for it): the first line,
/// without its line end; an empty one is refused.
pub fn secret_line(input: &mut dyn std::io::BufRead, flag: &str) -> anyhow::Result<String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .map_err(|e| anyhow::anyhow!("{flag}: cannot read stdin: {e}"))?;
    let secret = line.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        anyhow::bail!("{flag}: stdin held no password");
    }
    Ok(secret.to_string())
}

/// The secret of a `--X` / `--X-stdin` pair: the flag's value, or the first line of stdin.
/// `conn` refuses the stdin form when the connection password is read from stdin too.
pub fn flag_or_stdin(
    value: Option<String>,
    from_stdin: bool,
    flag: &str,
    conn: &ConnArgs,
) -> anyhow::Result<String> {
    if !from_stdin {
        return value.ok_or_else(|| anyhow::anyhow!("--{flag} or --{flag}-stdin is required"));
    }
    if conn.password_stdin {
        anyhow::bail!("stdin can carry one password: --password-stdin and --{flag}-stdin together");
    }
    secret_line(&mut std::io::stdin().lock(), &format!("--{flag}-stdin"))
}

/// The connection flags as arguments of the top-level command (not global): written
/// before a subcommand, they apply to it (`narad -s URL -u admin topic ls`), as Go Narad's
/// CLI takes them.
pub fn leading_args() -> Vec<clap::Arg> {
    use clap::Args as _;
    ConnArgs::augment_args(clap::Command::new("connection"))
        .get_arguments()
        .map(|a| a.clone().global(false))
        .collect()
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

/// Resolves the flags against this process's environment and contexts file (and stdin,
/// for `--password-stdin`).
pub fn resolve_env(args: &ConnArgs) -> anyhow::Result<Conn> {
    let mut args = args.clone();
    args.read_password(&mut std::io::stdin().lock())?;
    let args = &args;
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
            ..ConnArgs::default()
        };
        let c = resolve(&flags, &env, &ctxs(true));
        assert_eq!(c.server, "http://flag:3");
        assert_eq!(c.user.as_deref(), Some("ctxuser"));
        assert_eq!(c.password.as_deref(), Some("flagpass"));
    }

    #[test]
    fn flags_after_the_subcommand_win_over_leading_ones() {
        let leading = ConnArgs {
            server: Some("http://lead:1".into()),
            user: Some("lead".into()),
            password: Some("leadpass".into()),
            ..ConnArgs::default()
        };
        let mut sub = ConnArgs {
            user: Some("sub".into()),
            ..ConnArgs::default()
        };
        sub.fill_from(&leading);
        assert_eq!(sub.server.as_deref(), Some("http://lead:1"));
        assert_eq!(sub.user.as_deref(), Some("sub"));
        assert_eq!(sub.password.as_deref(), Some("leadpass"));
        // --password-stdin after the subcommand replaces a leading --password.
        let mut sub = ConnArgs {
            password_stdin: true,
            ..ConnArgs::default()
        };
        sub.fill_from(&leading);
        assert_eq!(sub.password, None);
        assert!(sub.password_stdin);
        assert!(ConnArgs::default().is_empty() && !leading.is_empty());
    }

    #[test]
    fn password_stdin_reads_one_line() {
        let mut a = ConnArgs {
            password_stdin: true,
            ..ConnArgs::default()
        };
        a.read_password(&mut &b"s3cret\r\nmore\n"[..]).unwrap();
        assert_eq!(a.password.as_deref(), Some("s3cret"));
        assert!(!a.password_stdin);
        for empty in [&b""[..], b"\n"] {
            let mut a = ConnArgs {
                password_stdin: true,
                ..ConnArgs::default()
            };
            let e = a.read_password(&mut &empty[..]).unwrap_err();
            assert!(e.to_string().contains("no password"), "{e}");
        }
        // Without the flag stdin is not touched.
        let mut a = ConnArgs::default();
        a.read_password(&mut &b"x\n"[..]).unwrap();
        assert_eq!(a.password, None);
    }

    #[test]
    fn leading_args_are_the_connection_flags_not_global() {
        let names: Vec<String> = leading_args()
            .iter()
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(
            names,
            ["server", "user", "password", "password_stdin", "ca_file"]
        );
        assert!(leading_args().iter().all(|a| !a.is_global_set()));
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
