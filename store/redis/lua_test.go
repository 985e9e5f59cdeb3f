package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice/internal/testenv"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
)

// scriptVM runs take.lua in-process: a Lua 5.1 VM (gopher-lua, whose
// numbers are float64 as Redis's Lua's are doubles) with the libraries the
// script uses (base, table, string, math, and Redis's struct, as far as the
// script uses it) and a redis.call of the commands it sends, on memRedis.
// Globals are read-only and unknown globals are errors, as in Redis.
//
// One difference from Redis's Lua: gopher-lua computes a % b exactly
// (math.Mod), where Lua 5.1 computes a − ⌊a/b⌋·b in doubles, whose
// quotient may be one off near an integer; the script corrects that case
// (divmod), and only the tests against a real Redis reach the correction.
type scriptVM struct {
	L     *lua.LState
	proto *lua.FunctionProto
	db    *memRedis
}

// protos holds the compiled scripts by their text: a compiled chunk is
// read-only, and gopher-lua's states may share it.
var protos sync.Map

// compile returns src, take.lua's text, compiled.
func compile(src string) (*lua.FunctionProto, error) {
	if p, ok := protos.Load(src); ok {
		return p.(*lua.FunctionProto), nil
	}
	chunk, err := parse.Parse(strings.NewReader(src), "take.lua")
	if err != nil {
		return nil, fmt.Errorf("parse take.lua: %w", err)
	}
	proto, err := lua.Compile(chunk, "take.lua")
	if err != nil {
		return nil, fmt.Errorf("compile take.lua: %w", err)
	}
	protos.Store(src, proto)
	return proto, nil
}

// newScriptVM compiles src, take.lua's text, for a VM on a fresh memRedis
// whose clock, for TIME and for expiry, is now.
func newScriptVM(t testing.TB, src string, now func() time.Time) *scriptVM {
	t.Helper()
	proto, err := compile(src)
	if err != nil {
		t.Fatal(err)
	}
	// unpack(KEYS) of 1,000 keys, as the script's MGET does, needs room.
	L := lua.NewState(lua.Options{SkipOpenLibs: true, RegistrySize: 1 << 14, RegistryMaxSize: 1 << 17})
	t.Cleanup(L.Close)
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	vm := &scriptVM{L: L, proto: proto, db: &memRedis{now: now, keys: map[string]*memValue{}}}
	redis := L.NewTable()
	redis.RawSetString("call", L.NewFunction(func(L *lua.LState) int { return vm.call(L, false) }))
	redis.RawSetString("pcall", L.NewFunction(func(L *lua.LState) int { return vm.call(L, true) }))
	L.SetGlobal("redis", redis)
	st := L.NewTable()
	st.RawSetString("pack", L.NewFunction(structPack))
	st.RawSetString("unpack", L.NewFunction(structUnpack))
	L.SetGlobal("struct", st)
	guard := L.NewTable()
	guard.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("Attempt to modify a readonly table: %s", L.CheckAny(2).String())
		return 0
	}))
	guard.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("Script attempted to access nonexistent global variable '%s'", L.CheckAny(2).String())
		return 0
	}))
	L.SetMetatable(L.G.Global, guard)
	return vm
}

// eval runs the script with keys and argv, as EVAL does, and returns its
// reply, which take.lua makes a string.
func (vm *scriptVM) eval(keys []string, argv ...string) ([]byte, error) {
	ret, err := vm.evalValue(keys, argv...)
	if err != nil {
		return nil, err
	}
	s, ok := ret.(lua.LString)
	if !ok {
		return nil, fmt.Errorf("take.lua returned %s, want a string", ret.Type())
	}
	return []byte(s), nil
}

// evalValue runs the script with keys and argv, as EVAL does, and returns
// the value it returned.
func (vm *scriptVM) evalValue(keys []string, argv ...string) (lua.LValue, error) {
	return vm.evalProto(vm.proto, keys, argv...)
}

// evalProto runs proto, a compiled script, on the VM's memRedis with keys
// and argv, as EVAL does, and returns its reply: another script than the
// VM's (lease.lua beside take.lua) on the same keys.
func (vm *scriptVM) evalProto(proto *lua.FunctionProto, keys []string, argv ...string) (lua.LValue, error) {
	vm.db.begin()
	L := vm.L
	for name, vs := range map[string][]string{"KEYS": keys, "ARGV": argv} {
		tb := L.CreateTable(len(vs), 0)
		for i, v := range vs {
			tb.RawSetInt(i+1, lua.LString(v))
		}
		L.G.Global.RawSetString(name, tb)
	}
	L.Push(L.NewFunctionFromProto(proto))
	if err := L.PCall(0, 1, nil); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	ret := L.Get(-1)
	L.Pop(1)
	return ret, nil
}

// call is redis.call (raising errors) and redis.pcall (returning them as
// {err = ...}): the arguments as Redis takes them (strings, and numbers
// written out), the reply as Redis converts it (nil as false, a status as
// {ok = ...}).
func (vm *scriptVM) call(L *lua.LState, protected bool) int {
	n := L.GetTop()
	args := make([]string, n)
	for i := range n {
		switch v := L.Get(i + 1).(type) {
		case lua.LString:
			args[i] = string(v)
		case lua.LNumber:
			args[i] = strconv.FormatFloat(float64(v), 'f', -1, 64)
		default:
			L.RaiseError("Lua redis lib command arguments must be strings or integers")
		}
	}
	if n == 0 {
		L.RaiseError("Please specify at least one argument for this redis lib call")
	}
	reply, err := vm.db.do(args)
	if err != nil {
		if !protected {
			L.RaiseError("%s", err.Error())
		}
		tb := L.NewTable()
		tb.RawSetString("err", lua.LString(err.Error()))
		L.Push(tb)
		return 1
	}
	L.Push(toLua(L, reply))
	return 1
}

// status is a Redis status reply, such as OK.
type status string

func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LFalse
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case status:
		tb := L.NewTable()
		tb.RawSetString("ok", lua.LString(v))
		return tb
	case []any:
		tb := L.CreateTable(len(v), 0)
		for i, x := range v {
			tb.RawSetInt(i+1, toLua(L, x))
		}
		return tb
	}
	panic(fmt.Sprintf("toLua: %T", v))
}

// memRedis is an in-memory Redis of strings and lists with TTLs, for the
// commands take.lua sends. Its clock, for TIME and for expiry, is now; a
// key expires once the clock is past its expiry time, in ms, as in Redis,
// and the clock seen last stands for the whole script call. Expiry goes by
// the latest time seen, so that a test clock stepping back does not
// revive a key, as Redis's own clock would not.
type memRedis struct {
	now     func() time.Time
	nowMs   int64 // the expiry clock: the latest time seen, ms
	keys    map[string]*memValue
	scripts int // script calls run
	expired int // keys found expired
}

type memValue struct {
	str    string
	list   []string // a list when non-nil
	expire int64    // ms since the Unix epoch; 0 for none
}

var errWrongType = errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")

// begin starts a script call: Redis reads its clock once per script.
func (db *memRedis) begin() {
	db.nowMs = max(db.nowMs, db.now().UnixMilli())
	db.scripts++
}

// get returns key's value, nil when it is missing or has expired.
func (db *memRedis) get(key string) *memValue {
	v := db.keys[key]
	if v != nil && v.expire != 0 && db.nowMs > v.expire {
		delete(db.keys, key)
		db.expired++
		return nil
	}
	return v
}

// list returns key's list, nil for none, or errWrongType.
func (db *memRedis) list(key string) ([]string, error) {
	v := db.get(key)
	if v == nil {
		return nil, nil
	}
	if v.list == nil {
		return nil, errWrongType
	}
	return v.list, nil
}

// index returns the offset of Redis list index i in a list of n, which
// may be out of range.
func index(i string, n int) (int, error) {
	k, err := strconv.Atoi(i)
	if err != nil {
		return 0, errors.New("ERR value is not an integer or out of range")
	}
	if k < 0 {
		k += n
	}
	return k, nil
}

// span returns the range [lo, hi) of LRANGE and LTRIM's start and stop.
func span(start, stop string, n int) (int, int, error) {
	lo, err := index(start, n)
	if err != nil {
		return 0, 0, err
	}
	hi, err := index(stop, n)
	if err != nil {
		return 0, 0, err
	}
	lo, hi = max(lo, 0), min(hi, n-1)+1
	if lo >= hi {
		return 0, 0, nil
	}
	return lo, hi, nil
}

func millis(s string) (int64, error) {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.New("ERR value is not an integer or out of range")
	}
	return ms, nil
}

// do runs one command; only those take.lua and async.lua send are known.
func (db *memRedis) do(args []string) (any, error) {
	cmd, a := strings.ToUpper(args[0]), args[1:]
	arity := map[string]int{"TIME": 0, "GET": 1, "MGET": -1, "SET": -2, "SETRANGE": 3, "PSETEX": 3, "PEXPIRE": 2, "DEL": -1,
		"LINDEX": 2, "LLEN": 1, "LRANGE": 3, "RPUSH": -2, "LPUSH": -2, "LTRIM": 3, "LSET": 3}
	want, ok := arity[cmd]
	if !ok {
		return nil, fmt.Errorf("ERR unknown command '%s' (memRedis knows only take.lua's and async.lua's)", args[0])
	}
	if want >= 0 && len(a) != want || want < 0 && len(a) < -want {
		return nil, fmt.Errorf("ERR wrong number of arguments for '%s' command", args[0])
	}
	switch cmd {
	case "TIME":
		us := db.now().UnixMicro()
		return []any{strconv.FormatInt(us/1e6, 10), strconv.FormatInt(us%1e6, 10)}, nil
	case "GET":
		v := db.get(a[0])
		switch {
		case v == nil:
			return nil, nil
		case v.list != nil:
			return nil, errWrongType
		}
		return v.str, nil
	case "MGET":
		out := make([]any, len(a))
		for i, k := range a {
			if v := db.get(k); v != nil && v.list == nil {
				out[i] = v.str
			}
		}
		return out, nil
	case "SET":
		if len(a) > 3 || len(a) == 3 && !strings.EqualFold(a[2], "KEEPTTL") {
			return nil, fmt.Errorf("ERR memRedis: SET options %q", a[2:])
		}
		nv := &memValue{str: a[1]}
		if v := db.get(a[0]); v != nil && len(a) == 3 {
			nv.expire = v.expire
		}
		db.keys[a[0]] = nv
		return status("OK"), nil
	case "SETRANGE":
		off, err := strconv.Atoi(a[1])
		if err != nil || off < 0 {
			return nil, errors.New("ERR offset is out of range")
		}
		v := db.get(a[0])
		switch {
		case v == nil && a[2] == "":
			return int64(0), nil // Redis makes no key
		case v == nil:
			v = &memValue{}
			db.keys[a[0]] = v
		case v.list != nil:
			return nil, errWrongType
		}
		b := []byte(v.str)
		if n := off + len(a[2]); n > len(b) {
			b = append(b, make([]byte, n-len(b))...)
		}
		copy(b[off:], a[2])
		v.str = string(b)
		return int64(len(b)), nil
	case "PSETEX":
		ms, err := millis(a[1])
		if err != nil {
			return nil, err
		}
		if ms <= 0 {
			return nil, errors.New("ERR invalid expire time in 'psetex' command")
		}
		db.keys[a[0]] = &memValue{str: a[2], expire: db.nowMs + ms}
		return status("OK"), nil
	case "PEXPIRE":
		ms, err := millis(a[1])
		if err != nil {
			return nil, err
		}
		v := db.get(a[0])
		if v == nil {
			return int64(0), nil
		}
		if ms <= 0 {
			delete(db.keys, a[0])
		} else {
			v.expire = db.nowMs + ms
		}
		return int64(1), nil
	case "DEL":
		var n int64
		for _, k := range a {
			if db.get(k) != nil {
				delete(db.keys, k)
				n++
			}
		}
		return n, nil
	case "LINDEX", "LLEN", "LRANGE":
		l, err := db.list(a[0])
		if err != nil {
			return nil, err
		}
		switch cmd {
		case "LLEN":
			return int64(len(l)), nil
		case "LINDEX":
			i, err := index(a[1], len(l))
			if err != nil || i < 0 || i >= len(l) {
				return nil, err
			}
			return l[i], nil
		}
		lo, hi, err := span(a[1], a[2], len(l))
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, hi-lo)
		for _, s := range l[lo:hi] {
			out = append(out, s)
		}
		return out, nil
	case "RPUSH", "LPUSH":
		l, err := db.list(a[0])
		if err != nil {
			return nil, err
		}
		v := db.keys[a[0]]
		if l == nil {
			v = &memValue{}
			db.keys[a[0]] = v
		}
		for _, s := range a[1:] {
			if cmd == "RPUSH" {
				v.list = append(v.list, s)
			} else {
				v.list = append([]string{s}, v.list...)
			}
		}
		return int64(len(v.list)), nil
	case "LTRIM":
		l, err := db.list(a[0])
		if err != nil || l == nil {
			return status("OK"), err
		}
		lo, hi, err := span(a[1], a[2], len(l))
		if err != nil {
			return nil, err
		}
		if lo == hi {
			delete(db.keys, a[0])
		} else {
			db.keys[a[0]].list = slices.Clone(l[lo:hi])
		}
		return status("OK"), nil
	default: // LSET
		l, err := db.list(a[0])
		if err != nil {
			return nil, err
		}
		if l == nil {
			return nil, errors.New("ERR no such key")
		}
		i, err := index(a[1], len(l))
		if err != nil {
			return nil, err
		}
		if i < 0 || i >= len(l) {
			return nil, errors.New("ERR index out of range")
		}
		l[i] = a[2]
		return status("OK"), nil
	}
}

// structFormat parses the formats of Redis's struct library that take.lua
// uses: little-endian ('<' first), of 'B' (an unsigned byte), 'd' (a
// double) and 'i' with its size in bytes (a signed integer). It returns
// each field's kind and size.
func structFormat(L *lua.LState, f string) (kinds []byte, sizes []int) {
	if !strings.HasPrefix(f, "<") {
		L.RaiseError("struct: format %q: memRedis knows only little-endian ('<')", f)
	}
	for i := 1; i < len(f); i++ {
		switch c := f[i]; c {
		case 'B':
			kinds, sizes = append(kinds, c), append(sizes, 1)
		case 'd':
			kinds, sizes = append(kinds, c), append(sizes, 8)
		case 'i':
			size := 4
			if i+1 < len(f) && f[i+1] >= '1' && f[i+1] <= '8' {
				size = int(f[i+1] - '0')
				i++
			}
			kinds, sizes = append(kinds, c), append(sizes, size)
		default:
			L.RaiseError("struct: format %q: memRedis does not know %q", f, c)
		}
	}
	return kinds, sizes
}

// structPack is struct.pack(format, ...).
func structPack(L *lua.LState) int {
	kinds, sizes := structFormat(L, L.CheckString(1))
	var b []byte
	for i, k := range kinds {
		x := float64(L.CheckNumber(i + 2))
		switch k {
		case 'B':
			b = append(b, byte(int64(x)))
		case 'd':
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		case 'i':
			var w [8]byte
			binary.LittleEndian.PutUint64(w[:], uint64(int64(x)))
			b = append(b, w[:sizes[i]]...)
		}
	}
	L.Push(lua.LString(b))
	return 1
}

// structUnpack is struct.unpack(format, data[, pos]): the fields, then
// the position after them.
func structUnpack(L *lua.LState) int {
	kinds, sizes := structFormat(L, L.CheckString(1))
	data := L.CheckString(2)
	pos := L.OptInt(3, 1) - 1
	for i, k := range kinds {
		if pos < 0 || pos+sizes[i] > len(data) {
			L.ArgError(2, "data string too short")
		}
		f := data[pos : pos+sizes[i]]
		switch k {
		case 'B':
			L.Push(lua.LNumber(f[0]))
		case 'd':
			L.Push(lua.LNumber(math.Float64frombits(binary.LittleEndian.Uint64([]byte(f)))))
		case 'i':
			var w [8]byte
			copy(w[:], f)
			v := int64(binary.LittleEndian.Uint64(w[:]))
			shift := 64 - 8*sizes[i]
			L.Push(lua.LNumber(v << shift >> shift)) // sign-extended
		}
		pos += sizes[i]
	}
	L.Push(lua.LNumber(pos + 1))
	return len(kinds) + 1
}

// TestMemRedisMatchesRedis sends the commands take.lua uses, with the
// edge cases it meets (wrong types, missing keys, indexes out of range, a
// list trimmed to nothing), to a real Redis and to memRedis, and compares
// the replies.
func TestMemRedisMatchesRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr},
		ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	p := fmt.Sprintf("memredis:%x:", rand.Uint64())
	s, l, m := p+"s", p+"l", p+"m"
	cmds := [][]string{
		{"SET", s, "v1", "KEEPTTL"}, {"PSETEX", s, "100000", "v2"}, {"SET", s, "v3", "KEEPTTL"},
		{"MGET", s, l, m}, {"GET", s}, {"GET", m}, {"RPUSH", l, "a", "b", "c"}, {"LPUSH", l, "z"}, {"MGET", s, l, m}, {"GET", l},
		{"LINDEX", l, "0"}, {"LINDEX", l, "-1"}, {"LINDEX", l, "9"}, {"LINDEX", s, "0"}, {"LINDEX", m, "0"},
		{"LLEN", l}, {"LLEN", m}, {"LLEN", s},
		{"LRANGE", l, "1", "2"}, {"LRANGE", l, "0", "-1"}, {"LRANGE", l, "5", "9"}, {"LRANGE", l, "-2", "100"},
		{"LRANGE", m, "0", "63"}, {"LRANGE", s, "0", "1"},
		{"LSET", l, "0", "y"}, {"LSET", l, "-1", "w"}, {"LSET", l, "9", "q"}, {"LSET", m, "0", "q"},
		{"LTRIM", l, "1", "-1"}, {"LRANGE", l, "0", "-1"}, {"LTRIM", l, "5", "9"}, {"LLEN", l}, {"MGET", l},
		{"RPUSH", s, "x"}, {"PEXPIRE", s, "100000"}, {"PEXPIRE", m, "100"}, {"DEL", s, m}, {"MGET", s},
		{"RPUSH", l, "a"}, {"SET", l, "v", "KEEPTTL"}, {"MGET", l}, {"LLEN", l},
		{"PSETEX", m, "0", "v"}, {"PEXPIRE", l, "0"}, {"MGET", l}, {"DEL", l, s, m},
		{"SETRANGE", m, "0", ""}, {"MGET", m}, {"SETRANGE", m, "0", "abc"}, {"PSETEX", s, "100000", "0123456789"}, {"SETRANGE", s, "0", "xy"},
		{"SETRANGE", s, "12", "z"}, {"MGET", s, m}, {"RPUSH", l, "a"}, {"SETRANGE", l, "0", "x"}, {"DEL", l, s, m},
	}
	db := &memRedis{now: time.Now, keys: map[string]*memValue{}}
	db.begin()
	ctx := context.Background()
	for _, cmd := range cmds {
		want := renderRedis(client.Do(ctx, client.B().Arbitrary(cmd...).Build()))
		got, err := db.do(cmd)
		if g := renderMem(got, err); g != want {
			t.Errorf("%q: memRedis %s, Redis %s", cmd, g, want)
		}
	}
}

// renderRedis and renderMem write a reply so that the two compare: an
// error by its kind only, a status as the string it holds.
func renderRedis(r rueidis.RedisResult) string {
	if err := r.Error(); err != nil {
		if rueidis.IsRedisNil(err) {
			return "nil"
		}
		if e, ok := rueidis.IsRedisErr(err); ok {
			kind, _, _ := strings.Cut(e.Error(), " ")
			if kind != "WRONGTYPE" {
				kind = "ERR"
			}
			return "error " + kind
		}
		return "failed: " + err.Error()
	}
	msg, _ := r.ToMessage()
	return renderMessage(&msg)
}

func renderMessage(m *rueidis.RedisMessage) string {
	switch {
	case m.IsNil():
		return "nil"
	case m.IsInt64():
		n, _ := m.ToInt64()
		return strconv.FormatInt(n, 10)
	case m.IsArray():
		vs, _ := m.ToArray()
		out := make([]string, len(vs))
		for i := range vs {
			out[i] = renderMessage(&vs[i])
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	s, err := m.ToString()
	if err != nil {
		return "unknown"
	}
	return strconv.Quote(s)
}

func renderMem(v any, err error) string {
	if err != nil {
		kind, _, _ := strings.Cut(err.Error(), " ")
		return "error " + kind
	}
	switch v := v.(type) {
	case nil:
		return "nil"
	case int64:
		return strconv.FormatInt(v, 10)
	case status:
		return strconv.Quote(string(v))
	case string:
		return strconv.Quote(v)
	case []any:
		out := make([]string, len(v))
		for i, x := range v {
			out[i] = renderMem(x, nil)
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	return fmt.Sprintf("unknown %T", v)
}

// TestScriptVMGlobals checks that the VM refuses what Redis refuses: a
// script that sets a global or reads one that does not exist.
func TestScriptVMGlobals(t *testing.T) {
	for _, src := range []string{"x = 1 return ''", "return tostring(undefined)"} {
		vm := newScriptVM(t, src, time.Now)
		if _, err := vm.eval(nil); err == nil {
			t.Errorf("%q ran", src)
		}
	}
	vm := newScriptVM(t, "return tostring(math.max(1, 2)) .. ARGV[1]", time.Now)
	if out, err := vm.eval(nil, "x"); err != nil || string(out) != "2x" {
		t.Errorf("a script that only reads globals: %q, %v", out, err)
	}
}
