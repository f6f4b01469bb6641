//! OS users and path resolution, without NSS.
//!
//! berth-envd is a static binary bind-mounted into sandboxes whose libc we do not control,
//! so it reads `/etc/passwd` and `/etc/group` itself. Processes in the sandbox may add users
//! (`useradd`) at any time, so every lookup asks the file system whether a file changed
//! (one `stat`) and reads it again when it did; an unchanged file's text is remembered,
//! which spares a command start the reads (see [`RememberedFile`]).
//!
//! A request's user comes from `Authorization: Basic base64("<user>:")` (or the `username`
//! query parameter of `/files`), else the default user set at `/init`, else — envd running
//! as a plain host process without `/init`, as in tests — the user envd itself runs as.
//!
//! Paths follow E2B's envd: an empty path means the default workdir, `~` and `~/x` expand
//! to the user's home, and any other relative path is joined to the user's home.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use base64::Engine;

/// An OS user as `/etc/passwd` and `/etc/group` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Supplementary groups from `/etc/group` membership, without the primary group,
    /// sorted and deduplicated.
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

impl User {
    /// Every group the user's processes carry: the primary group first, then the
    /// supplementary ones (what `setgroups` should receive).
    pub fn all_gids(&self) -> Vec<u32> {
        let mut gids = Vec::with_capacity(self.groups.len() + 1);
        gids.push(self.gid);
        gids.extend(self.groups.iter().copied().filter(|&g| g != self.gid));
        gids
    }
}

/// Why a user could not be looked up or picked for a request.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("error looking up user '{0}': unknown user {0}")]
    UnknownUser(String),
    #[error("error reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid Authorization header: {0}")]
    InvalidAuthorization(&'static str),
}

/// Why a request path could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("invalid path '{0}': cannot expand another user's home dir (only '~' and '~/...' are supported)")]
    OtherUsersHome(String),
    #[error("invalid path '{0}': contains a NUL byte")]
    NulByte(String),
}

/// Reads users and groups from `<root>/etc/passwd` and `<root>/etc/group`.
#[derive(Debug, Clone)]
pub struct UserDb {
    passwd: Arc<RememberedFile>,
    group: Arc<RememberedFile>,
}

/// A small file's text, kept while the file system says the file is unchanged.
///
/// "Unchanged" is the same device, inode, size, mtime and ctime. A write lands within
/// one tick of the kernel's coarse file clock, so two writes of the same size in one
/// tick could leave the same stamp; a text is therefore kept only once its file has
/// been still for a while ([`RememberedFile::SETTLED`], git's "racy" rule), and a file changed
/// more recently is read on every lookup.
#[derive(Debug)]
struct RememberedFile {
    path: PathBuf,
    /// How long the file must have been unchanged for its text to be kept.
    settled: Duration,
    kept: Mutex<Option<(FileStamp, Arc<str>)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }

    /// Whether the file's last change was at least `settled` before `opened` (taken
    /// before the file was opened: a write after it could be in the text read).
    fn settled(&self, settled: Duration, opened: SystemTime) -> bool {
        let (secs, nanos) = self.mtime.max(self.ctime);
        let (Ok(secs), Ok(nanos)) = (u64::try_from(secs), u32::try_from(nanos)) else {
            // Before 1970: long settled.
            return true;
        };
        let changed = Duration::new(secs, nanos);
        opened
            .duration_since(SystemTime::UNIX_EPOCH)
            .is_ok_and(|opened| changed.saturating_add(settled) <= opened)
    }
}

impl RememberedFile {
    /// Far beyond any kernel's file-clock tick.
    const SETTLED: Duration = Duration::from_secs(2);

    fn new(path: PathBuf, settled: Duration) -> Self {
        Self {
            path,
            settled,
            kept: Mutex::new(None),
        }
    }

    /// The file's text; a missing file reads as empty (a minimal rootfs without
    /// `/etc/group` is legitimate: no groups at all).
    fn text(&self) -> Result<Arc<str>, UserError> {
        let error = |source| UserError::Read {
            path: self.path.clone(),
            source,
        };
        let current = match std::fs::metadata(&self.path) {
            Ok(metadata) => FileStamp::of(&metadata),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Arc::from("")),
            Err(e) => return Err(error(e)),
        };
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((stamp, text)) = kept.as_ref() {
            if *stamp == current {
                return Ok(Arc::clone(text));
            }
        }
        let opened = SystemTime::now();
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Arc::from("")),
            Err(e) => return Err(error(e)),
        };
        // The stamp of the file actually read, not of the path stat'ed above.
        let stamp = FileStamp::of(&file.metadata().map_err(error)?);
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(error)?;
        let text: Arc<str> = Arc::from(text);
        *kept = stamp
            .settled(self.settled, opened)
            .then(|| (stamp, Arc::clone(&text)));
        Ok(text)
    }
}

impl Default for UserDb {
    fn default() -> Self {
        Self::system()
    }
}

/// A passwd line, before group membership is added.
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

/// A group line.
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

impl UserDb {
    /// The machine's (or sandbox's) own `/etc`.
    pub fn system() -> Self {
        Self::with_root("/")
    }

    /// Files under `root` (`root/etc/passwd`, `root/etc/group`); for tests.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let file = |name| {
            Arc::new(RememberedFile::new(
                root.join(name),
                RememberedFile::SETTLED,
            ))
        };
        Self {
            passwd: file("etc/passwd"),
            group: file("etc/group"),
        }
    }

    fn passwd_entries(&self) -> Result<Vec<PasswdEntry>, UserError> {
        Ok(parse_passwd(&self.passwd.text()?))
    }

    fn group_entries(&self) -> Result<Vec<GroupEntry>, UserError> {
        Ok(parse_group(&self.group.text()?))
    }

    fn complete(&self, entry: PasswdEntry) -> Result<User, UserError> {
        let mut groups: Vec<u32> = self
            .group_entries()?
            .into_iter()
            .filter(|g| g.gid != entry.gid && g.members.contains(&entry.name))
            .map(|g| g.gid)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        Ok(User {
            name: entry.name,
            uid: entry.uid,
            gid: entry.gid,
            groups,
            home: PathBuf::from(entry.home),
            shell: PathBuf::from(entry.shell),
        })
    }

    /// The user named `name`.
    pub fn lookup(&self, name: &str) -> Result<User, UserError> {
        let entry = self
            .passwd_entries()?
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| UserError::UnknownUser(name.to_owned()))?;
        self.complete(entry)
    }

    /// The first user with `uid`, if any.
    pub fn lookup_uid(&self, uid: u32) -> Result<Option<User>, UserError> {
        match self.passwd_entries()?.into_iter().find(|e| e.uid == uid) {
            Some(entry) => self.complete(entry).map(Some),
            None => Ok(None),
        }
    }

    /// The user envd itself runs as (effective uid). When passwd has no such uid (a
    /// container started with an arbitrary uid) a user is synthesized from `$USER`/`$HOME`.
    pub fn current(&self) -> Result<User, UserError> {
        let uid = rustix::process::geteuid().as_raw();
        if let Some(user) = self.lookup_uid(uid)? {
            return Ok(user);
        }
        let gid = rustix::process::getegid().as_raw();
        Ok(User {
            name: std::env::var("USER").unwrap_or_else(|_| uid.to_string()),
            uid,
            gid,
            groups: Vec::new(),
            home: std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from),
            shell: PathBuf::from("/bin/sh"),
        })
    }

    /// A uid → name and gid → name snapshot, for naming owners of many entries at once.
    pub fn id_names(&self) -> Result<IdNames, UserError> {
        let mut users = HashMap::new();
        for e in self.passwd_entries()? {
            // The first line for an id wins, as with getpwuid.
            users.entry(e.uid).or_insert(e.name);
        }
        let mut groups = HashMap::new();
        for g in self.group_entries()? {
            groups.entry(g.gid).or_insert(g.name);
        }
        Ok(IdNames { users, groups })
    }

    /// The user a request runs as: `explicit` (from `Authorization: Basic` or a `username`
    /// parameter) if given, else `default_user` (set at `/init`), else envd's own user.
    pub fn resolve(
        &self,
        explicit: Option<&str>,
        default_user: Option<&str>,
    ) -> Result<User, UserError> {
        match explicit.or(default_user) {
            Some(name) => self.lookup(name),
            None => self.current(),
        }
    }
}

/// Names of uids and gids; ids without a name are shown as numbers, like `ls -l` does.
#[derive(Debug, Clone, Default)]
pub struct IdNames {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl IdNames {
    pub fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 7 || fields[0].is_empty() {
                return None;
            }
            Some(PasswdEntry {
                name: fields[0].to_owned(),
                uid: fields[2].parse().ok()?,
                gid: fields[3].parse().ok()?,
                home: fields[5].to_owned(),
                shell: fields[6].to_owned(),
            })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 4 || fields[0].is_empty() {
                return None;
            }
            Some(GroupEntry {
                name: fields[0].to_owned(),
                gid: fields[2].parse().ok()?,
                members: fields[3]
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect(),
            })
        })
        .collect()
}

/// The user name in `Authorization: Basic base64("<user>:<anything>")`; `None` when the
/// header is not Basic auth at all (other schemes are not ours to judge). An empty user
/// name counts as absent, as in Go's `BasicAuth`-based envd.
pub fn basic_auth_username(header_value: &str) -> Result<Option<String>, UserError> {
    let Some((scheme, credentials)) = header_value.trim().split_once(' ') else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(None);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials.trim())
        .map_err(|_| UserError::InvalidAuthorization("Basic credentials are not base64"))?;
    let decoded = String::from_utf8(decoded)
        .map_err(|_| UserError::InvalidAuthorization("Basic credentials are not UTF-8"))?;
    let (username, _password) = decoded
        .split_once(':')
        .ok_or(UserError::InvalidAuthorization(
            "Basic credentials lack the ':' separator",
        ))?;
    Ok((!username.is_empty()).then(|| username.to_owned()))
}

/// Resolves a request path for `user`: empty → `default_workdir` (else the home),
/// `~`/`~/x` → the home,
/// other relative paths → joined to the home. The result is absolute and lexically
/// normalized (`.` and `..` removed; `..` above `/` stays at `/`). Symlinks are not
/// followed: callers act on the path the client named.
pub fn resolve_path(
    path: &str,
    user: &User,
    default_workdir: Option<&str>,
) -> Result<PathBuf, PathError> {
    // E2B: an empty path is the default workdir, or the home when none is set.
    let path = if path.is_empty() {
        default_workdir.unwrap_or("~")
    } else {
        path
    };
    if path.contains('\0') {
        return Err(PathError::NulByte(path.replace('\0', "\\0")));
    }
    let joined = if let Some(rest) = path.strip_prefix('~') {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(PathError::OtherUsersHome(path.to_owned()));
        }
        user.home.join(rest.trim_start_matches('/'))
    } else if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        user.home.join(path)
    };
    Ok(normalize(&joined))
}

/// Lexical normalization of an absolute path (like Go's `filepath.Clean`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
# a comment

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
user:x:1000:1000:E2B user,,,:/home/user:/bin/bash
broken line without fields
baduid:x:notanumber:1:bad:/:/bin/sh
other:x:1001:1001::/home/other:/bin/sh
alias:x:1000:1000::/home/alias:/bin/sh
";

    const GROUP: &str = "\
root:x:0:
daemon:x:1:
sudo:x:27:user
docker:x:999:other, user
user:x:1000:user
other:x:1001:
";

    struct Fixture {
        dir: PathBuf,
    }

    impl Fixture {
        fn new(name: &str, passwd: &str, group: Option<&str>) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("berth-envd-users-{name}-{}", std::process::id()));
            std::fs::create_dir_all(dir.join("etc")).unwrap();
            std::fs::write(dir.join("etc/passwd"), passwd).unwrap();
            if let Some(group) = group {
                std::fs::write(dir.join("etc/group"), group).unwrap();
            }
            Self { dir }
        }

        fn db(&self) -> UserDb {
            UserDb::with_root(&self.dir)
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn looks_up_user_with_supplementary_groups() {
        let fx = Fixture::new("lookup", PASSWD, Some(GROUP));
        let user = fx.db().lookup("user").unwrap();
        assert_eq!(
            user,
            User {
                name: "user".into(),
                uid: 1000,
                gid: 1000,
                groups: vec![27, 999],
                home: "/home/user".into(),
                shell: "/bin/bash".into(),
            }
        );
        assert_eq!(user.all_gids(), vec![1000, 27, 999]);
        let other = fx.db().lookup("other").unwrap();
        assert_eq!(other.groups, vec![999]);
        assert_eq!(other.all_gids(), vec![1001, 999]);
    }

    #[test]
    fn unknown_and_malformed_users_are_not_found() {
        let fx = Fixture::new("unknown", PASSWD, Some(GROUP));
        let db = fx.db();
        for name in ["nobody", "baduid", "broken line without fields", ""] {
            let err = db.lookup(name).unwrap_err();
            assert!(
                matches!(err, UserError::UnknownUser(ref n) if n == name),
                "{err}"
            );
        }
        assert_eq!(
            db.lookup("nobody").unwrap_err().to_string(),
            "error looking up user 'nobody': unknown user nobody"
        );
    }

    #[test]
    fn missing_group_file_means_no_groups() {
        let fx = Fixture::new("nogroup", PASSWD, None);
        let user = fx.db().lookup("user").unwrap();
        assert!(user.groups.is_empty());
        assert_eq!(fx.db().id_names().unwrap().group(1000), "1000");
    }

    #[test]
    fn missing_passwd_means_unknown_user() {
        let db = UserDb::with_root("/nonexistent-berth-root");
        assert!(matches!(db.lookup("root"), Err(UserError::UnknownUser(_))));
    }

    #[test]
    fn a_settled_file_is_read_once_until_it_changes() {
        let fx = Fixture::new("remembered", PASSWD, None);
        let file = RememberedFile::new(fx.dir.join("etc/passwd"), Duration::ZERO);
        let first = file.text().unwrap();
        assert!(Arc::ptr_eq(&first, &file.text().unwrap()), "read again");
        let added = format!("{PASSWD}new:x:1002:1002::/home/new:/bin/sh\n");
        std::fs::write(fx.dir.join("etc/passwd"), &added).unwrap();
        assert_eq!(&*file.text().unwrap(), added.as_str());
    }

    #[test]
    fn a_recently_changed_file_is_read_on_every_lookup() {
        // Same size, in place, within one tick of the file clock: the stamp may not
        // change, so a just-written file is never kept.
        let fx = Fixture::new("racy", "aaaa:x:1:1::/:/bin/sh\n", None);
        let db = fx.db();
        assert_eq!(db.lookup("aaaa").unwrap().uid, 1);
        std::fs::write(fx.dir.join("etc/passwd"), "bbbb:x:1:1::/:/bin/sh\n").unwrap();
        assert_eq!(db.lookup("bbbb").unwrap().uid, 1);
        let file = RememberedFile::new(fx.dir.join("etc/passwd"), RememberedFile::SETTLED);
        assert!(!Arc::ptr_eq(&file.text().unwrap(), &file.text().unwrap()));
    }

    #[test]
    fn a_file_that_appears_later_is_read() {
        let fx = Fixture::new("appears", PASSWD, None);
        let db = fx.db();
        assert!(db.lookup("user").unwrap().groups.is_empty());
        std::fs::write(fx.dir.join("etc/group"), GROUP).unwrap();
        assert_eq!(db.lookup("user").unwrap().groups, vec![27, 999]);
    }

    #[test]
    fn names_ids_first_entry_wins_and_unknown_ids_are_numeric() {
        let fx = Fixture::new("names", PASSWD, Some(GROUP));
        let names = fx.db().id_names().unwrap();
        assert_eq!(names.user(0), "root");
        assert_eq!(names.user(1000), "user");
        assert_eq!(names.user(4242), "4242");
        assert_eq!(names.group(27), "sudo");
        assert_eq!(names.group(4243), "4243");
        assert_eq!(fx.db().lookup_uid(1001).unwrap().unwrap().name, "other");
        assert!(fx.db().lookup_uid(4242).unwrap().is_none());
    }

    #[test]
    fn resolve_prefers_explicit_then_default_then_current() {
        let fx = Fixture::new("resolve", PASSWD, Some(GROUP));
        let db = fx.db();
        assert_eq!(
            db.resolve(Some("other"), Some("user")).unwrap().name,
            "other"
        );
        assert_eq!(db.resolve(None, Some("user")).unwrap().name, "user");
        assert!(matches!(
            db.resolve(Some("ghost"), Some("user")),
            Err(UserError::UnknownUser(_))
        ));
        let current = db.resolve(None, None).unwrap();
        assert_eq!(current.uid, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn current_user_of_real_system_matches_euid() {
        let me = UserDb::system().current().unwrap();
        assert_eq!(me.uid, rustix::process::geteuid().as_raw());
        assert!(me.home.is_absolute());
    }

    #[test]
    fn parses_basic_auth_username() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            basic_auth_username(&format!("Basic {}", b64("user:"))).unwrap(),
            Some("user".into())
        );
        assert_eq!(
            basic_auth_username(&format!("basic {}", b64("root:ignored"))).unwrap(),
            Some("root".into())
        );
        assert_eq!(
            basic_auth_username(&format!("Basic {}", b64(":"))).unwrap(),
            None
        );
        assert_eq!(basic_auth_username("Bearer abc").unwrap(), None);
        assert_eq!(basic_auth_username("garbage").unwrap(), None);
        assert!(matches!(
            basic_auth_username("Basic !!!"),
            Err(UserError::InvalidAuthorization(_))
        ));
        assert!(matches!(
            basic_auth_username(&format!("Basic {}", b64("nocolon"))),
            Err(UserError::InvalidAuthorization(_))
        ));
    }

    fn user() -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            groups: vec![],
            home: "/home/user".into(),
            shell: "/bin/bash".into(),
        }
    }

    #[test]
    fn resolves_paths_like_e2b() {
        let u = user();
        let r = |p: &str, wd: Option<&str>| resolve_path(p, &u, wd);
        assert_eq!(r("~", None).unwrap(), PathBuf::from("/home/user"));
        assert_eq!(r("~/", None).unwrap(), PathBuf::from("/home/user"));
        assert_eq!(r("~/a/b", None).unwrap(), PathBuf::from("/home/user/a/b"));
        assert_eq!(r("x.txt", None).unwrap(), PathBuf::from("/home/user/x.txt"));
        assert_eq!(r("./d/../x", None).unwrap(), PathBuf::from("/home/user/x"));
        assert_eq!(r("../../../..", None).unwrap(), PathBuf::from("/"));
        assert_eq!(
            r("/etc//hosts/", None).unwrap(),
            PathBuf::from("/etc/hosts")
        );
        assert_eq!(r("/a/./b/../c", None).unwrap(), PathBuf::from("/a/c"));
        // Relative paths resolve against the home even with a default workdir set.
        assert_eq!(
            r("x", Some("/work")).unwrap(),
            PathBuf::from("/home/user/x")
        );
        assert_eq!(r("", Some("/work")).unwrap(), PathBuf::from("/work"));
        assert_eq!(r("", Some("~/w")).unwrap(), PathBuf::from("/home/user/w"));
    }

    #[test]
    fn rejects_invalid_paths() {
        let u = user();
        assert_eq!(
            resolve_path("", &u, None).unwrap(),
            PathBuf::from("/home/user")
        );
        assert_eq!(
            resolve_path("~root/x", &u, None),
            Err(PathError::OtherUsersHome("~root/x".into()))
        );
        let err = resolve_path("a\0b", &u, None).unwrap_err();
        assert!(matches!(err, PathError::NulByte(_)));
        assert!(err.to_string().contains("a\\0b"));
    }
}
