//! The image config's `User` (`user`, `uid`, `user:group`, `uid:gid`, …) turned into numeric
//! ids, looking names up in the image's own `/etc/passwd` and `/etc/group` (never the
//! host's), the way runc does; and the numeric `UID[:GID]` that `kiln run --user` puts in its
//! place.

use std::path::Path;

use crate::rootpath::{self, Last};

/// Numeric ids to run as, and the home directory from `/etc/passwd` when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory of that user in the image's `/etc/passwd`.
    pub home: Option<String>,
}

/// Numeric ids that replace the image's `User` (`kiln run --user UID[:GID]`, a Pod's
/// `runAsUser`/`runAsGroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl std::str::FromStr for Ids {
    type Err = Error;

    /// Parses `UID` or `UID:GID`, both numeric; the group defaults to the user id.
    fn from_str(spec: &str) -> Result<Ids, Error> {
        let invalid = || Error::InvalidIds(spec.to_string());
        let number = |s: &str| s.parse::<u32>().map_err(|_| invalid());
        match spec.split_once(':') {
            Some((uid, gid)) => Ok(Ids {
                uid: number(uid)?,
                gid: number(gid)?,
            }),
            None => {
                let uid = number(spec)?;
                Ok(Ids { uid, gid: uid })
            }
        }
    }
}

/// Why the image's user cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A user name that is not in the image's `/etc/passwd`.
    #[error("user {0:?} is not in the image's /etc/passwd")]
    UnknownUser(String),
    /// A group name that is not in the image's `/etc/group`.
    #[error("group {0:?} is not in the image's /etc/group")]
    UnknownGroup(String),
    /// A `--user` value that is not `UID[:GID]` in numbers.
    #[error("user {0:?} is not UID or UID:GID (numbers, e.g. 10001 or 10001:10001)")]
    InvalidIds(String),
    /// An account file of the image larger than any real one.
    #[error("the image's {path} is over {limit} bytes, the most kiln reads of it")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit.
        limit: u64,
    },
}

/// The most kiln reads of the image's `/etc/passwd` or `/etc/group`.
pub const MAX_ACCOUNT_FILE: u64 = 4 * 1024 * 1024;

/// One `/etc/passwd` line.
#[derive(Debug)]
struct Passwd<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn passwd_entries(text: &str) -> impl Iterator<Item = Passwd<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        Some(Passwd {
            name: f.first()?,
            uid: f.get(2)?.parse().ok()?,
            gid: f.get(3)?.parse().ok()?,
            home: f.get(5).copied().unwrap_or(""),
        })
    })
}

fn group_id(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
    })
}

/// Resolves `spec` (empty or absent means root) against the passwd and group file contents.
///
/// # Errors
/// A user or group name that the files do not list.
pub fn resolve(spec: Option<&str>, passwd: &str, group: &str) -> Result<User, Error> {
    let spec = spec.unwrap_or("").trim();
    let (user, group_spec) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = match user.parse::<u32>() {
        Ok(uid) => passwd_entries(passwd).find(|p| p.uid == uid),
        Err(_) if user.is_empty() => passwd_entries(passwd).find(|p| p.uid == 0),
        Err(_) => Some(
            passwd_entries(passwd)
                .find(|p| p.name == user)
                .ok_or_else(|| Error::UnknownUser(user.into()))?,
        ),
    };
    let uid = match (user.parse::<u32>(), &entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some(p)) => p.uid,
        (Err(_), None) => 0,
    };
    let gid = match group_spec.filter(|g| !g.is_empty()) {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_id(group, g).ok_or_else(|| Error::UnknownGroup(g.into()))?,
        },
        None => entry.as_ref().map_or(0, |p| p.gid),
    };
    Ok(User {
        uid,
        gid,
        home: entry.map(|p| p.home.to_string()).filter(|h| !h.is_empty()),
    })
}

/// Ids given in place of the image's `User`, with the home directory the image's
/// `/etc/passwd` lists for that uid.
pub fn with_ids(ids: Ids, passwd: &str) -> User {
    User {
        uid: ids.uid,
        gid: ids.gid,
        home: passwd_entries(passwd)
            .find(|p| p.uid == ids.uid)
            .map(|p| p.home.to_string())
            .filter(|h| !h.is_empty()),
    }
}

/// Reads an account file of the image (`/etc/passwd`), resolving symlinks inside `rootfs`,
/// at most [`MAX_ACCOUNT_FILE`] bytes of it; a missing or unreadable file reads as empty,
/// like an image without one.
///
/// # Errors
/// [`Error::TooLarge`].
pub fn read_image_file(rootfs: &Path, path: &str) -> Result<String, Error> {
    let read = rootpath::resolve(rootfs, Path::new(path), Last::Follow)
        .map_err(std::io::Error::other)
        .and_then(std::fs::File::open)
        .and_then(|file| rootpath::read_to_limit(file, MAX_ACCOUNT_FILE));
    match read {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => Err(Error::TooLarge {
            path: path.into(),
            limit: MAX_ACCOUNT_FILE,
        }),
        Err(_) => Ok(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n\
                          app:x:1001:50:App:/srv:/bin/false\nbroken line\n";
    const GROUP: &str = "root:x:0:\nnode:x:1000:\nstaff:x:50:app\n";

    fn user(spec: &str) -> Result<User, Error> {
        resolve(Some(spec), PASSWD, GROUP)
    }

    #[test]
    fn names_and_numbers_resolve_through_the_images_files() {
        let root = User {
            uid: 0,
            gid: 0,
            home: Some("/root".into()),
        };
        assert_eq!(resolve(None, PASSWD, GROUP).unwrap(), root);
        assert_eq!(user("").unwrap(), root);
        let node = user("node").unwrap();
        assert_eq!((node.uid, node.gid), (1000, 1000));
        assert_eq!(node.home.as_deref(), Some("/home/node"));
        assert_eq!(user("1001").unwrap().gid, 50);
        assert_eq!(user("app:node").unwrap().gid, 1000);
        assert_eq!(user("app:7").unwrap().gid, 7);
        assert_eq!(user("node:staff").unwrap().gid, 50);
    }

    #[test]
    fn unknown_numeric_ids_are_used_as_they_are() {
        assert_eq!(
            user("4242").unwrap(),
            User {
                uid: 4242,
                gid: 0,
                home: None
            }
        );
        assert_eq!(user("4242:99").unwrap().gid, 99);
        assert_eq!(resolve(Some("1000"), "", "").unwrap().gid, 0);
    }

    #[test]
    fn unknown_names_are_errors() {
        assert!(matches!(user("nobody"), Err(Error::UnknownUser(n)) if n == "nobody"));
        assert!(matches!(user("node:wheel"), Err(Error::UnknownGroup(g)) if g == "wheel"));
    }

    #[test]
    fn numeric_ids_replace_the_image_user_and_the_group_defaults_to_the_user() {
        let ids: Ids = "10001".parse().unwrap();
        assert_eq!(
            ids,
            Ids {
                uid: 10001,
                gid: 10001
            }
        );
        let ids: Ids = "1000:50".parse().unwrap();
        let user = with_ids(ids, PASSWD);
        assert_eq!((user.uid, user.gid), (1000, 50));
        assert_eq!(user.home.as_deref(), Some("/home/node"));
        assert_eq!(with_ids("4242".parse().unwrap(), PASSWD).home, None);
        for bad in ["", "node", "1000:", ":5", "1:2:3", "-1"] {
            let err = bad.parse::<Ids>().unwrap_err();
            assert!(
                matches!(&err, Error::InvalidIds(s) if s == bad),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn image_files_are_read_through_symlinks_inside_the_rootfs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("real"), PASSWD).unwrap();
        std::os::unix::fs::symlink("/real", dir.path().join("etc/passwd")).unwrap();
        assert_eq!(read_image_file(dir.path(), "/etc/passwd").unwrap(), PASSWD);
        assert_eq!(read_image_file(dir.path(), "/etc/group").unwrap(), "");
    }

    #[test]
    fn an_account_file_is_read_up_to_its_limit_and_refused_past_it() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(read_image_file(root.path(), "/etc/passwd").unwrap(), "");
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/group"), GROUP).unwrap();
        assert_eq!(read_image_file(root.path(), "/etc/group").unwrap(), GROUP);
        // 512 MiB, sparse: read whole it would be held whole.
        let passwd = std::fs::File::create(root.path().join("etc/passwd")).unwrap();
        passwd.set_len(512 << 20).unwrap();
        let e = read_image_file(root.path(), "/etc/passwd").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the image's /etc/passwd is over 4194304 bytes, the most kiln reads of it"
        );
    }
}
