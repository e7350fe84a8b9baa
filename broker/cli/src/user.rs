//! `narad user add|grant|quotas|passwd|ls|rm`.

use std::io::Write;

use anyhow::bail;
use narad_api::{CreateUserRequest, Grant, Quotas, User};

use crate::conn::{connect, flag_or_stdin, ConnArgs};
use crate::output::{utc_ms, Table};

/// `narad user …`
#[derive(Debug, clap::Subcommand)]
pub enum UserCmd {
    /// Create a user
    Add {
        /// Username
        name: String,
        /// The new user's password
        #[arg(
            long,
            value_name = "P",
            required_unless_present = "user_password_stdin"
        )]
        user_password: Option<String>,
        /// Read the new user's password from the first line of stdin
        #[arg(long, conflicts_with = "user_password")]
        user_password_stdin: bool,
        /// A grant: ACTION:PATTERN[,PATTERN…] (produce, consume, create) or admin; repeatable
        #[arg(long = "grant", short = 'g', value_name = "ACTION:PATTERNS", value_parser = parse_grant)]
        grants: Vec<Grant>,
    },
    /// Replace all of a user's grants
    Grant {
        /// Username
        name: String,
        /// A grant: ACTION:PATTERN[,PATTERN…] or admin; repeatable
        #[arg(long = "grant", short = 'g', value_name = "ACTION:PATTERNS", value_parser = parse_grant,
              required_unless_present = "none")]
        grants: Vec<Grant>,
        /// Remove all grants
        #[arg(long, conflicts_with = "grants")]
        none: bool,
    },
    /// Replace all of a user's quotas (cluster-wide; each node enforces its share)
    Quotas {
        /// Username
        name: String,
        /// Messages produced per second
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        produce_msgs_per_s: Option<u64>,
        /// Payload bytes produced per second
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        produce_bytes_per_s: Option<u64>,
        /// Topics the user may own
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        max_topics: Option<u64>,
        /// Messages leased and not yet settled at once
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        consume_in_flight: Option<u64>,
        /// Lift every quota
        #[arg(long, conflicts_with_all = ["produce_msgs_per_s", "produce_bytes_per_s", "max_topics", "consume_in_flight"],
              required_unless_present_any = ["produce_msgs_per_s", "produce_bytes_per_s", "max_topics", "consume_in_flight"])]
        none: bool,
    },
    /// Change a password (your own needs --current)
    Passwd {
        /// Username
        name: String,
        /// The current password (when changing your own)
        #[arg(long, value_name = "P")]
        current: Option<String>,
        /// The new password
        #[arg(long, value_name = "P", required_unless_present = "new_stdin")]
        new: Option<String>,
        /// Read the new password from the first line of stdin
        #[arg(long, conflicts_with = "new")]
        new_stdin: bool,
    },
    /// List users
    Ls {
        /// Print the users as JSON
        #[arg(long)]
        json: bool,
    },
    /// Delete a user
    Rm {
        /// Username
        name: String,
    },
}

/// Parses `action:pat,pat` (or a bare action, e.g. `admin`).
pub fn parse_grant(s: &str) -> Result<Grant, String> {
    let (action, pats) = match s.split_once(':') {
        Some((a, p)) => (a, p),
        None => (s, ""),
    };
    let action = action.trim();
    if action.is_empty() {
        return Err(format!(
            "invalid grant {s:?}: expected ACTION:PATTERN[,PATTERN…]"
        ));
    }
    let patterns: Vec<String> = pats
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Grant {
        action: action.to_string(),
        patterns,
    })
}

/// `produce:orders-*,x consume:*`
pub fn format_grants(grants: &[Grant]) -> String {
    if grants.is_empty() {
        return "-".into();
    }
    grants
        .iter()
        .map(|g| {
            if g.patterns.is_empty() {
                g.action.clone()
            } else {
                format!("{}:{}", g.action, g.patterns.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `100 msg/s, 1048576 B/s, 5 topics, 50 in flight`, or `-` for none.
pub fn format_quotas(q: Option<&Quotas>) -> String {
    let Some(q) = q else { return "-".into() };
    let parts: Vec<String> = [
        q.produce_msgs_per_s.map(|v| format!("{v} msg/s")),
        q.produce_bytes_per_s.map(|v| format!("{v} B/s")),
        q.max_topics.map(|v| format!("{v} topics")),
        q.consume_in_flight.map(|v| format!("{v} in flight")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The `user ls` table.
pub fn users_table(users: &[User]) -> Table {
    let mut t = Table::new(["USERNAME", "ROOT", "GRANTS", "QUOTAS", "CREATED", "UPDATED"]);
    for u in users {
        t.row([
            u.username.clone(),
            if u.root { "yes" } else { "" }.to_string(),
            format_grants(&u.grants),
            format_quotas(u.quotas.as_ref()),
            if u.created_at_ms > 0 {
                utc_ms(u.created_at_ms)
            } else {
                "-".into()
            },
            if u.updated_at_ms > 0 {
                utc_ms(u.updated_at_ms)
            } else {
                "-".into()
            },
        ]);
    }
    t
}

/// Runs a `user` command.
pub async fn run(cmd: UserCmd, conn: &ConnArgs) -> anyhow::Result<()> {
    let client = connect(conn)?;
    let mut out = std::io::stdout().lock();
    match cmd {
        UserCmd::Add {
            name,
            user_password,
            user_password_stdin,
            grants,
        } => {
            let user_password =
                flag_or_stdin(user_password, user_password_stdin, "user-password", conn)?;
            if user_password.is_empty() {
                bail!("--user-password must not be empty");
            }
            let u = client
                .create_user(&CreateUserRequest {
                    username: name,
                    password: user_password,
                    grants,
                })
                .await?;
            writeln!(
                out,
                "created user {} ({})",
                u.username,
                format_grants(&u.grants)
            )?;
        }
        UserCmd::Grant { name, grants, none } => {
            let grants = if none { Vec::new() } else { grants };
            let u = client.put_grants(&name, &grants).await?;
            writeln!(
                out,
                "grants of {}: {}",
                u.username,
                format_grants(&u.grants)
            )?;
        }
        UserCmd::Quotas {
            name,
            produce_msgs_per_s,
            produce_bytes_per_s,
            max_topics,
            consume_in_flight,
            none: _,
        } => {
            let q = Quotas {
                produce_msgs_per_s,
                produce_bytes_per_s,
                max_topics,
                consume_in_flight,
            };
            let u = client.put_quotas(&name, &q).await?;
            writeln!(
                out,
                "quotas of {}: {}",
                u.username,
                format_quotas(u.quotas.as_ref())
            )?;
        }
        UserCmd::Passwd {
            name,
            current,
            new,
            new_stdin,
        } => {
            let new = flag_or_stdin(new, new_stdin, "new", conn)?;
            if new.is_empty() {
                bail!("--new must not be empty");
            }
            client.set_password(&name, current.as_deref(), &new).await?;
            writeln!(out, "changed the password of {name}")?;
        }
        UserCmd::Ls { json } => {
            let users = client.list_users().await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &users)?;
                writeln!(out)?;
            } else {
                users_table(&users).write(&mut out)?;
            }
        }
        UserCmd::Rm { name } => {
            client.delete_user(&name).await?;
            writeln!(out, "deleted user {name}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants() {
        assert_eq!(
            parse_grant("produce:orders-*,audit").unwrap(),
            Grant {
                action: "produce".into(),
                patterns: vec!["orders-*".into(), "audit".into()]
            }
        );
        assert_eq!(parse_grant("admin").unwrap().patterns, Vec::<String>::new());
        assert_eq!(
            parse_grant("consume:").unwrap().patterns,
            Vec::<String>::new()
        );
        assert!(parse_grant(":x").is_err());
        let gs = vec![
            parse_grant("admin").unwrap(),
            parse_grant("consume:*").unwrap(),
        ];
        assert_eq!(format_grants(&gs), "admin consume:*");
    }
}
