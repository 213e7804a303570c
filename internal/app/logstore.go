package app

import (
	"path/filepath"
	"strconv"

	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// UpdateLogDir is the seal directory's subdirectory of update log
// segments (docs/update-log.md); on etcd the keys are
// <prefix>updatelog-<n>.
const UpdateLogDir = "updatelog"

// logSegments returns where update log segment n is kept: a file
// <seal dir>/updatelog/<n>, or the etcd key <prefix>updatelog-<n>.
func (a *App) logSegments() func(n uint64) (store.Store, error) {
	if a.cfg.Store.Kind == config.StoreEtcd {
		cli := a.etcd
		return func(n uint64) (store.Store, error) {
			return cli.Store("updatelog-" + strconv.FormatUint(n, 10))
		}
	}
	dir := filepath.Join(a.cfg.SealDir, UpdateLogDir)
	return func(n uint64) (store.Store, error) {
		return filestore.New(dir, strconv.FormatUint(n, 10))
	}
}

// restoreMarker returns the store of the marker `coordinator restore`
// leaves in the seal directory (docs/backup.md); nil on etcd, which is
// backed up and restored with etcd's own tools.
func (a *App) restoreMarker() (store.Store, error) {
	if a.cfg.Store.Kind == config.StoreEtcd {
		return nil, nil
	}
	return filestore.New(a.cfg.SealDir, updatelog.RestoreMarkerFile)
}
