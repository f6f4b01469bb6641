//! The Connect RPC paths envd serves: `/<package>.<Service>/<Method>`, all `POST`.

/// `process.Process/Start` (server stream): start a process and follow its events.
pub const PROCESS_START: &str = "/process.Process/Start";
/// `process.Process/Connect` (server stream): follow a running process's events.
pub const PROCESS_CONNECT: &str = "/process.Process/Connect";
/// `process.Process/List` (unary).
pub const PROCESS_LIST: &str = "/process.Process/List";
/// `process.Process/SendInput` (unary).
pub const PROCESS_SEND_INPUT: &str = "/process.Process/SendInput";
/// `process.Process/StreamInput` (client stream).
pub const PROCESS_STREAM_INPUT: &str = "/process.Process/StreamInput";
/// `process.Process/SendSignal` (unary).
pub const PROCESS_SEND_SIGNAL: &str = "/process.Process/SendSignal";
/// `process.Process/CloseStdin` (unary).
pub const PROCESS_CLOSE_STDIN: &str = "/process.Process/CloseStdin";
/// `process.Process/Update` (unary): resize a PTY.
pub const PROCESS_UPDATE: &str = "/process.Process/Update";

/// `filesystem.Filesystem/Stat` (unary).
pub const FILESYSTEM_STAT: &str = "/filesystem.Filesystem/Stat";
/// `filesystem.Filesystem/MakeDir` (unary).
pub const FILESYSTEM_MAKE_DIR: &str = "/filesystem.Filesystem/MakeDir";
/// `filesystem.Filesystem/Move` (unary).
pub const FILESYSTEM_MOVE: &str = "/filesystem.Filesystem/Move";
/// `filesystem.Filesystem/ListDir` (unary).
pub const FILESYSTEM_LIST_DIR: &str = "/filesystem.Filesystem/ListDir";
/// `filesystem.Filesystem/Remove` (unary).
pub const FILESYSTEM_REMOVE: &str = "/filesystem.Filesystem/Remove";
/// `filesystem.Filesystem/WatchDir` (server stream).
pub const FILESYSTEM_WATCH_DIR: &str = "/filesystem.Filesystem/WatchDir";
/// `filesystem.Filesystem/CreateWatcher` (unary).
pub const FILESYSTEM_CREATE_WATCHER: &str = "/filesystem.Filesystem/CreateWatcher";
/// `filesystem.Filesystem/GetWatcherEvents` (unary).
pub const FILESYSTEM_GET_WATCHER_EVENTS: &str = "/filesystem.Filesystem/GetWatcherEvents";
/// `filesystem.Filesystem/RemoveWatcher` (unary).
pub const FILESYSTEM_REMOVE_WATCHER: &str = "/filesystem.Filesystem/RemoveWatcher";
