// The TCP rendezvous store, compiled once for the whole tool: the tool defines
// AUTOSHARD_TCP_STORE_SEPARATE for all its files, so gloo/tcp_store.hpp only declares the
// store and this file holds its definitions (gloo/tcp_store_impl.hpp).
#include <autoshard/gloo/tcp_store_impl.hpp>
