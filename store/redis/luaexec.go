package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/rueidis"
)

// luaScript is a script called with EVALSHA, the calls pipelined, and with
// EVAL, the script's text, only for the calls a node answers NOSCRIPT (a
// restart, a failover, SCRIPT FLUSH): one round trip. rueidis's
// Lua.ExecMulti sends SCRIPT LOAD, the whole text, to every node before
// each call, which took a second round trip and the text each time: for
// store/regions, whose rounds read a peer region's counts across the WAN
// with SyncCounts, twice the WAN delay a read and ~9KB a read.
type luaScript struct {
	src, sha string
}

func newLuaScript(src string) *luaScript {
	h := sha1.Sum([]byte(src))
	return &luaScript{src: src, sha: hex.EncodeToString(h[:])}
}

// execMulti runs the script once for each of execs, pipelined, and returns
// the results in their order.
func (l *luaScript) execMulti(ctx context.Context, c rueidis.Client, execs ...rueidis.LuaExec) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = c.B().Evalsha().Sha1(l.sha).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	return doScripts(ctx, c, cmds, func(i int) rueidis.Completed {
		e := execs[i]
		return c.B().Eval().Script(l.src).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	})
}

// doScripts sends cmds, script calls by EVALSHA, pipelined, and, for each
// a node answered NOSCRIPT (a restart, a failover, SCRIPT FLUSH), eval(i),
// the same call with the script's text, in one more round trip; it returns
// the results in cmds' order. The calls sent again are new commands:
// rueidis may still read those sent after DoMulti returned at a deadline.
func doScripts(ctx context.Context, c rueidis.Client, cmds rueidis.Commands, eval func(i int) rueidis.Completed) []rueidis.RedisResult {
	res := c.DoMulti(ctx, cmds...)
	var retry []int
	for i, r := range res {
		if err, ok := rueidis.IsRedisErr(r.Error()); ok && err.IsNoScript() {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return res
	}
	again := make(rueidis.Commands, len(retry))
	for k, i := range retry {
		again[k] = eval(i)
	}
	for k, r := range c.DoMulti(ctx, again...) {
		res[retry[k]] = r
	}
	return res
}
