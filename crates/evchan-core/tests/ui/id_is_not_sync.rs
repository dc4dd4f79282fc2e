// An id is Send but not Sync: calls on one id are never concurrent.
use evchan_core::cm::state::Connected;
use evchan_core::CmId;

fn share(id: &CmId<'static, Connected>) {
    std::thread::scope(|s| {
        s.spawn(|| id.key());
    });
}

fn main() {}
