// Background threads of the daemon (capture, flush, the storage thread) run at a lower priority
// (a positive nice value, per thread) than its event loop. The loop answers trainers' requests —
// a Save() must return in well under a millisecond — while the background threads are long,
// CPU-bound copies; on a loaded core the scheduler then lets the freshly woken loop run at once
// instead of after the copying thread's time slice. Lowering a priority needs no privilege.
#pragma once

namespace ckpt {

// Sets the calling thread's nice value (0 = leave it alone). Failures are logged, not fatal.
void SetThisThreadNice(int nice);

}  // namespace ckpt
