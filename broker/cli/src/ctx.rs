//! Contexts: named connection settings in `$NARAD_CONFIG_DIR/contexts.json` (default
//! `<user config dir>/narad/contexts.json`), written with mode 0600 (SPEC §7.2).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::output::Table;

/// The file name inside the config directory.
pub const FILE_NAME: &str = "contexts.json";

/// One context.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Context {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// The whole file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContextFile {
    /// The selected context, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

impl ContextFile {
    /// The selected context, if it exists.
    pub fn selected(&self) -> Option<(&str, &Context)> {
        let name = self.current.as_deref()?;
        self.contexts.get(name).map(|c| (name, c))
    }
}

/// The config directory: `$NARAD_CONFIG_DIR`, else `<user config dir>/narad`.
pub fn config_dir_from(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    if let Some(d) = env("NARAD_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let base = dirs::config_dir()
        .ok_or_else(|| anyhow!("cannot find the user config directory: set NARAD_CONFIG_DIR"))?;
    Ok(base.join("narad"))
}

/// The path of the contexts file for this process's environment.
pub fn contexts_path() -> anyhow::Result<PathBuf> {
    Ok(config_dir_from(&|k| std::env::var(k).ok())?.join(FILE_NAME))
}

/// Reads the file; a missing file is an empty one.
pub fn load(path: &Path) -> anyhow::Result<ContextFile> {
    match std::fs::read(path) {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(ContextFile::default()),
        Ok(b) => serde_json::from_slice(&b)
            .with_context(|| format!("cannot read contexts file {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ContextFile::default()),
        Err(e) => Err(anyhow!("cannot read contexts file {}: {e}", path.display())),
    }
}

/// Writes the file atomically with mode 0600 (its directory 0700 when created).
pub fn save(path: &Path, file: &ContextFile) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    create_dir_private(dir)
        .with_context(|| format!("cannot create config directory {}", dir.display()))?;
    let mut json = serde_json::to_vec_pretty(file)?;
    json.push(b'\n');
    let tmp = dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = open_private(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        set_private(path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("cannot write contexts file {}: {e}", path.display())
    })
}

#[cfg(unix)]
fn create_dir_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_dir_private(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(unix)]
fn open_private(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
}

#[cfg(not(unix))]
fn open_private(p: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::create(p)
}

#[cfg(unix)]
fn set_private(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn set_private(_: &Path) -> std::io::Result<()> {
    Ok(())
}

/// `narad ctx …`
#[derive(Debug, clap::Subcommand)]
pub enum CtxCmd {
    /// Add (or replace) a context
    Add {
        /// Context name
        name: String,
        /// Server URL, e.g. http://narad.example.com:7942
        #[arg(long, short = 's', value_name = "URL")]
        server: String,
        /// Username
        #[arg(long, short = 'u')]
        user: Option<String>,
        /// Password
        #[arg(long, short = 'p')]
        password: Option<String>,
        /// Read the password from the first line of stdin
        #[arg(long, conflicts_with = "password")]
        password_stdin: bool,
    },
    /// Select the context used by client commands
    Select {
        /// Context name
        name: String,
    },
    /// List contexts (the selected one is marked with *)
    Ls,
    /// Remove a context
    Rm {
        /// Context name
        name: String,
    },
}

/// Runs a `ctx` command against the contexts file at `path`, writing to `out`.
pub fn run_at(cmd: CtxCmd, path: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut file = load(path)?;
    match cmd {
        CtxCmd::Add {
            name,
            server,
            user,
            password,
            password_stdin,
        } => {
            let password = match password_stdin {
                true => Some(crate::conn::secret_line(
                    &mut std::io::stdin().lock(),
                    "--password-stdin",
                )?),
                false => password,
            };
            if name.is_empty() {
                bail!("context name must not be empty");
            }
            let server = narad_api::client::normalize_base_url(&server)?;
            let existed = file
                .contexts
                .insert(
                    name.clone(),
                    Context {
                        server,
                        user: user.filter(|u| !u.is_empty()),
                        password,
                    },
                )
                .is_some();
            save(path, &file)?;
            let verb = if existed { "updated" } else { "added" };
            if file.current.as_deref() == Some(name.as_str()) {
                writeln!(out, "{verb} context {name} (selected)")?;
            } else {
                writeln!(
                    out,
                    "{verb} context {name}; select it with: narad ctx select {name}"
                )?;
            }
        }
        CtxCmd::Select { name } => {
            if !file.contexts.contains_key(&name) {
                bail!("no context named {name:?} (see narad ctx ls)");
            }
            file.current = Some(name.clone());
            save(path, &file)?;
            writeln!(out, "selected context {name}")?;
        }
        CtxCmd::Ls => {
            if file.contexts.is_empty() {
                writeln!(
                    out,
                    "no contexts (add one with: narad ctx add NAME --server URL)"
                )?;
                return Ok(());
            }
            let mut t = Table::new(["CURRENT", "NAME", "SERVER", "USER"]);
            for (name, c) in &file.contexts {
                let cur = if file.current.as_deref() == Some(name.as_str()) {
                    "*"
                } else {
                    ""
                };
                t.row([
                    cur.to_string(),
                    name.clone(),
                    c.server.clone(),
                    c.user.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            t.write(out)?;
        }
        CtxCmd::Rm { name } => {
            if file.contexts.remove(&name).is_none() {
                bail!("no context named {name:?}");
            }
            if file.current.as_deref() == Some(name.as_str()) {
                file.current = None;
            }
            save(path, &file)?;
            writeln!(out, "removed context {name}")?;
        }
    }
    Ok(())
}

/// Runs a `ctx` command.
pub fn run(cmd: CtxCmd) -> anyhow::Result<()> {
    let path = contexts_path()?;
    run_at(cmd, &path, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_s(cmd: CtxCmd, path: &Path) -> anyhow::Result<String> {
        let mut out = Vec::new();
        run_at(cmd, path, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn add_select_ls_rm() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(FILE_NAME);
        run_s(
            CtxCmd::Add {
                name: "prod".into(),
                server: "narad.example.com:7942/".into(),
                user: Some("admin".into()),
                password: Some("s3cret".into()),
                password_stdin: false,
            },
            &path,
        )
        .unwrap();
        let f = load(&path).unwrap();
        assert_eq!(f.current, None);
        assert_eq!(f.contexts["prod"].server, "http://narad.example.com:7942");
        assert!(run_s(
            CtxCmd::Select {
                name: "nope".into()
            },
            &path
        )
        .is_err());
        run_s(
            CtxCmd::Select {
                name: "prod".into(),
            },
            &path,
        )
        .unwrap();
        let ls = run_s(CtxCmd::Ls, &path).unwrap();
        assert!(ls.contains("* "), "{ls}");
        assert!(ls.contains("http://narad.example.com:7942"));
        assert!(!ls.contains("s3cret"));
        assert_eq!(load(&path).unwrap().selected().unwrap().0, "prod");
        run_s(
            CtxCmd::Rm {
                name: "prod".into(),
            },
            &path,
        )
        .unwrap();
        let f = load(&path).unwrap();
        assert!(f.contexts.is_empty());
        assert_eq!(f.current, None);
        assert!(run_s(
            CtxCmd::Rm {
                name: "prod".into()
            },
            &path
        )
        .is_err());
        assert!(run_s(
            CtxCmd::Add {
                name: "bad".into(),
                server: "ftp://x".into(),
                user: None,
                password: None,
                password_stdin: false,
            },
            &path
        )
        .is_err());
    }

    #[cfg(unix)]
    #[test]
    fn file_mode_is_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        // A pre-existing world-readable file is tightened on save.
        std::fs::write(&path, "{}").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        save(&path, &ContextFile::default()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A fresh directory is private.
        let nested = dir.path().join("a").join(FILE_NAME);
        save(&nested, &ContextFile::default()).unwrap();
        let mode = std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(dir.path().join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
    }

    #[test]
    fn config_dir_env() {
        let d =
            config_dir_from(&|k| (k == "NARAD_CONFIG_DIR").then(|| "/x/y".to_string())).unwrap();
        assert_eq!(d, PathBuf::from("/x/y"));
        // Empty means unset.
        if let Ok(d) = config_dir_from(&|_| Some(String::new())) {
            assert!(d.ends_with("narad"));
        }
    }

    #[test]
    fn missing_or_empty_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE_NAME);
        assert_eq!(load(&p).unwrap(), ContextFile::default());
        std::fs::write(&p, "\n").unwrap();
        assert_eq!(load(&p).unwrap(), ContextFile::default());
        std::fs::write(&p, "{oops").unwrap();
        assert!(load(&p).is_err());
    }
}
