//! One executor per [`super::decide::Step`]: each does exactly the writes its step names, and
//! says where the object stands after. The dispatcher is `sync`.

pub(super) mod deletion;
pub(super) mod marks;
pub(super) mod spec_up;
pub(super) mod status_down;
