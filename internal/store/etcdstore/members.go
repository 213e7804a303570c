package etcdstore

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Members returns the values the other live members registered with Join
// (all members before Join), read now.
func (c *Client) Members(ctx context.Context) ([][]byte, error) {
	dir := c.prefix + "members/"
	me := ""
	if c.stopLease != nil {
		me = dir + strconv.FormatInt(int64(c.lease), 16)
	}
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: listing members: %w", err)
	}
	var out [][]byte
	for _, kv := range resp.Kvs {
		if string(kv.Key) != me {
			out = append(out, append([]byte{}, kv.Value...))
		}
	}
	return out, nil
}
