//! Placeholder owned by the envd-files helper.
