package core

import "github.com/quarry-cc/quarry/internal/store/etcdstore"

var (
	_ chunkStore        = (*etcdstore.Store)(nil)
	_ committedNotifier = (*etcdstore.Store)(nil)
)
