//! The POSIX sh scripts build steps run inside build sandboxes. They take their
//! parameters from `BERTH_*` environment variables (never spliced into the script text,
//! so no value can inject shell code) and use only sh builtins and the tools every
//! image has (coreutils or busybox); images without /bin/sh cannot be built on.

/// Prints /etc/passwd, /etc/group and whether bash exists, separated by markers.
pub(crate) const PROBE: &str = r#"cat /etc/passwd 2>/dev/null; echo '@@berth@@'
cat /etc/group 2>/dev/null; echo '@@berth@@'
[ -x /bin/bash ] && echo bash; exit 0"#;

/// Prefix of every command: enter `$BERTH_CWD` (or `/` when it does not exist), then
/// exec the command given as arguments.
pub(crate) const ENTER_CWD: &str = r#"cd "$BERTH_CWD" 2>/dev/null || cd /
unset BERTH_CWD
exec "$@""#;

/// Helpers: `has_prefix PREFIX FILE` (no grep needed), `user_home NAME`,
/// `create_user NAME UID`, `grant_sudo NAME`.
macro_rules! helpers {
    () => {
        r#"set -e
has_prefix() { [ -f "$2" ] || return 1; while IFS= read -r l; do case "$l" in "$1"*) return 0;; esac; done < "$2"; return 1; }
user_home() { while IFS=: read -r n p u g c h s; do if [ "$n" = "$1" ]; then echo "$h"; return 0; fi; done < /etc/passwd; return 1; }
create_user() {
  if ! has_prefix "$1:" /etc/passwd; then
    if command -v useradd >/dev/null 2>&1; then
      useradd --uid "$2" --create-home --shell /bin/bash "$1" 2>/dev/null || useradd --create-home --shell /bin/bash "$1"
    elif command -v adduser >/dev/null 2>&1; then
      adduser -D -u "$2" -s /bin/sh "$1" 2>/dev/null || adduser -D "$1"
    else
      shell=/bin/sh; [ -x /bin/bash ] && shell=/bin/bash
      has_prefix "$1:" /etc/group || echo "$1:x:$2:" >> /etc/group
      echo "$1:x:$2:$2::/home/$1:$shell" >> /etc/passwd
      if [ -f /etc/shadow ]; then echo "$1::19000:0:99999:7:::" >> /etc/shadow; fi
    fi
  fi
  home=$(user_home "$1")
  if [ -n "$home" ] && [ ! -d "$home" ]; then mkdir -p "$home"; chown "$1:" "$home" 2>/dev/null || chown "$1" "$home"; fi
}
grant_sudo() {
  line="$1 ALL=(ALL:ALL) NOPASSWD: ALL"
  mkdir -p /etc/sudoers.d
  echo "$line" > "/etc/sudoers.d/berth-$1"
  chmod 0440 "/etc/sudoers.d/berth-$1"
  if [ -f /etc/sudoers ] && ! has_prefix '@includedir /etc/sudoers.d' /etc/sudoers && ! has_prefix '#includedir /etc/sudoers.d' /etc/sudoers && ! has_prefix "$line" /etc/sudoers; then
    echo "$line" >> /etc/sudoers
  fi
  for g in sudo wheel; do
    if has_prefix "$g:" /etc/group; then usermod -aG "$g" "$1" 2>/dev/null || addgroup "$1" "$g" 2>/dev/null || true; fi
  done
  passwd -d "$1" >/dev/null 2>&1 || true
  command -v sudo >/dev/null 2>&1 || echo "berth: the image has no sudo; $1 gets sudo rights once it is installed" >&2
}
"#
    };
}

/// E2B's user phase: `user` (uid 1000 when free) with a home and passwordless sudo.
pub(crate) const USER_SETUP: &str = concat!(helpers!(), "create_user user 1000\ngrant_sudo user\n");

/// USER NAME: the user is created when missing.
pub(crate) const CREATE_USER: &str = concat!(helpers!(), "create_user \"$BERTH_USER\" 1000\n");

/// USER NAME true: created when missing, and given passwordless sudo.
pub(crate) const CREATE_SUDO_USER: &str = concat!(
    helpers!(),
    "create_user \"$BERTH_USER\" 1000\ngrant_sudo \"$BERTH_USER\"\n"
);

/// WORKDIR: create `$BERTH_TARGET` and give what was created to `$BERTH_OWNER`
/// (only the new directories, as E2B does).
pub(crate) const WORKDIR: &str = r#"set -e
target="$BERTH_TARGET"
[ -d "$target" ] && exit 0
first_new=""
check="$target"
while [ ! -d "$check" ]; do first_new="$check"; check=$(dirname "$check"); done
mkdir -p "$target"
if [ -n "$first_new" ]; then chown -R "$BERTH_OWNER:" "$first_new" 2>/dev/null || chown -R "$BERTH_OWNER" "$first_new"; fi
"#;

/// COPY: unpack the upload (stdin) on /tmp (a tmpfs: never part of the layer), then
/// move the source into place as E2B's copy script does (Docker COPY semantics: a
/// trailing slash makes the target a directory; directories merge into existing ones;
/// symlinks are kept as links).
pub(crate) const COPY: &str = r#"set -e
unpack="/tmp/.berth-copy-$BERTH_HASH"
rm -rf "$unpack"; mkdir -p "$unpack/unpack"
if [ -n "$BERTH_GZIP" ]; then tar -xzf - -C "$unpack/unpack"; else tar -xf - -C "$unpack/unpack"; fi
workdir="$BERTH_WORKDIR"
if [ -z "$workdir" ]; then workdir=$(while IFS=: read -r n p u g c h s; do [ "$n" = "$BERTH_USER" ] && echo "$h"; done < /etc/passwd); fi
cd "${workdir:-/}" 2>/dev/null || cd /
case "$BERTH_TARGET" in /*) target="$BERTH_TARGET";; *) target="$(pwd)/$BERTH_TARGET";; esac
source="$unpack/unpack/$BERTH_SOURCE"
cd "$(dirname "$source")"
entry="$(basename "$source")"
if [ ! -e "$entry" ] && [ ! -L "$entry" ]; then echo "source path does not exist: $BERTH_SOURCE" >&2; exit 1; fi
prepare_parent() { case "$target" in */) mkdir -p "$target";; *) mkdir -p "$(dirname "$target")";; esac; }
if [ -L "$entry" ]; then
  prepare_parent
  chown -h "$BERTH_OWNER" "$entry"
  mv "$entry" "$target"
elif [ -f "$entry" ]; then
  chown "$BERTH_OWNER" "$entry"
  if [ -n "$BERTH_MODE" ]; then chmod "$BERTH_MODE" "$entry"; fi
  prepare_parent
  mv "$entry" "$target"
elif [ -d "$entry" ]; then
  chown -R "$BERTH_OWNER" "$entry"
  if [ -n "$BERTH_MODE" ]; then chmod -R "$BERTH_MODE" "$entry"; fi
  mkdir -p "$target"
  if tar --version 2>/dev/null | head -n 1 | grep -q GNU; then
    (cd "$entry" && tar -cf - .) | tar -xf - -C "$target" --keep-directory-symlink --no-overwrite-dir
  else
    cp -a "$entry/." "$target/"
  fi
else
  echo "the source is neither a file, a directory nor a symlink" >&2; exit 1
fi
cd /
rm -rf "$unpack"
"#;

/// The start command, detached: in a session of its own (CRIU dumps only sessions led
/// inside the sandbox's pid namespace, and this script's session is led outside it),
/// re-parented to the sandbox's init (which reaps it) when this script exits, stdio on
/// a log file inside the sandbox so a checkpoint holds nothing of the host.
pub(crate) const START: &str = r#"cmd="$BERTH_START"; log="$BERTH_START_LOG"; shell="$BERTH_SHELL"
unset BERTH_START BERTH_START_LOG BERTH_SHELL
if ! command -v setsid >/dev/null 2>&1; then
  echo "berth: the image has no setsid (util-linux or busybox); a start command needs it" >&2
  exit 1
fi
setsid $shell "$cmd" > "$log" 2>&1 < /dev/null &
exit 0
"#;
