// Clang's thread-safety attributes (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) as
// macros: with clang and -Wthread-safety (cmake/Warnings.cmake adds it), the compiler checks
// that every access to a GUARDED_BY field happens with its mutex held, that a REQUIRES function
// is called with it held, and that an EXCLUDES function is not. Under other compilers the
// macros are empty. The capabilities themselves are ckpt::Mutex and ckpt::MutexLock
// (common/mutex.h).
//
// Abseil's legacy header (absl/base/internal/thread_annotations.h, which gRPC's headers bring
// in) defines GUARDED_BY, PT_GUARDED_BY, ACQUIRED_BEFORE/AFTER and NO_THREAD_SAFETY_ANALYSIS
// with the same attributes: those five are defined here only when it has not defined them
// first (when it comes second, its redefinition is in a system header, where clang is silent).
//
//   mutable Mutex mu_;
//   std::deque<Item> queue_ GUARDED_BY(mu_);
//   Item* current_ PT_GUARDED_BY(mu_);     // the pointee, not the pointer, is guarded
//   void PopLocked() REQUIRES(mu_);        // caller holds mu_
//   void Post(Item) EXCLUDES(mu_);         // caller must not hold mu_ (it takes it)
#pragma once

#if defined(__clang__)
#define CKPT_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define CKPT_THREAD_ANNOTATION_(x)
#endif

// A class that is a lock (ckpt::Mutex); the string names the kind in the diagnostics.
#define CAPABILITY(x) CKPT_THREAD_ANNOTATION_(capability(x))
// An RAII class that holds a capability for its lifetime (ckpt::MutexLock).
#define SCOPED_CAPABILITY CKPT_THREAD_ANNOTATION_(scoped_lockable)
// A field read or written only with the mutex held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) CKPT_THREAD_ANNOTATION_(guarded_by(x))
#endif
// A pointer (or smart pointer) whose pointee is read or written only with the mutex held.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) CKPT_THREAD_ANNOTATION_(pt_guarded_by(x))
#endif
// Lock ordering: this mutex is taken before / after the named ones.
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) CKPT_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) CKPT_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#endif
// The function is called with the mutex held (exclusively / shared) and returns with it held.
#define REQUIRES(...) CKPT_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) CKPT_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// The function takes the mutex and returns with it held.
#define ACQUIRE(...) CKPT_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) CKPT_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
// The function is called with the mutex held and returns with it released.
#define RELEASE(...) CKPT_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) CKPT_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) CKPT_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
// The function tries to take the mutex; the first argument is the return value on success.
#define TRY_ACQUIRE(...) CKPT_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) CKPT_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))
// The caller must not hold the mutex (the function takes it itself).
#define EXCLUDES(...) CKPT_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
// A run-time check that the mutex is held: afterwards the analysis assumes it is.
#define ASSERT_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(assert_shared_capability(x))
// The function returns a reference to the named mutex.
#define RETURN_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(lock_returned(x))
// Turns the analysis off for one function. Only where the pattern is beyond the analysis, with a
// comment at that spot saying why.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS CKPT_THREAD_ANNOTATION_(no_thread_safety_analysis)
#endif
