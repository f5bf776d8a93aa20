/* Allocator snapshot reader: a pickle walked by its opcodes, never run.

   Plain C loaded with ctypes (no Python headers), built by hatch_build.py
   like formats/kineto/scan.c. It reads the opcodes a pickle of dicts, lists,
   tuples, strings and numbers uses into a small tree (a memoized object is
   one node, however often it is referenced), then takes from it the columns
   the peak needs: per trace entry its action, address, size, time and stack;
   per segment and block their sizes, state and stack; one table of distinct
   stacks over the distinct frame dicts.

   Security: opcodes that name or call code (GLOBAL, STACK_GLOBAL, REDUCE,
   BUILD, INST, OBJ, NEWOBJ, persistent ids, extensions) are refused with
   status REFUSED; any other opcode not listed is UNSUPPORTED. Nothing is
   ever executed. Status is not OK also for every shape the fast path does
   not take (a missing key, a value out of range, a float time): the caller
   then reads the file with the Python loader, which gives every message. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, REFUSED = 1, UNSUPPORTED = 2, TRUNCATED = 3, MALFORMED = 4, SHAPE = 5,
       NOMEM = 6 };
enum { T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_LIST, T_TUPLE, T_DICT, T_MARK };

typedef struct {
    uint64_t u;                 /* int magnitude, bool, str offset, float bits */
    int32_t *items;             /* dict: key, value, key, value ... */
    int32_t len, cap;           /* str bytes; container items (cap 0: shared items) */
    int32_t tag;                /* a list with interned items: its entry + 1 */
    uint8_t type, neg, big;     /* big: the magnitude needs more than 64 bits */
} Node;

typedef struct {
    int status;
    char error[160];
    const uint8_t *buf;
    int64_t n;
    Node *nodes;
    int64_t n_nodes, cap_nodes;
    int32_t top;
    int64_t n_dicts;
    uint64_t *bigs;
    int64_t n_bigs, cap_bigs;
    /* columns */
    int64_t n_entries;
    int32_t *e_device, *e_stack;
    int8_t *e_action;
    uint64_t *e_addr;
    int64_t *e_size, *e_time;
    int64_t n_segments;
    uint64_t *s_addr;
    int64_t *s_total;
    int32_t *s_device, *s_first, *s_count, *s_stack;
    int64_t n_blocks;
    uint64_t *b_addr;
    int64_t *b_size;
    int8_t *b_state;
    int32_t *b_stack;
    int64_t n_frames;           /* distinct frame dicts */
    int64_t *f_file, *f_file_len, *f_name, *f_name_len, *f_line;
    int8_t *f_has;              /* bit 1 filename, 2 name, 4 line */
    int64_t n_stacks, n_stack_items;
    int32_t *st_start, *st_items; /* stack k: items[start[k] .. start[k+1]) */
    int32_t *frame_of, *stack_of; /* node -> frame / stack index + 1, 0 none */
    /* interned list items: lists of the same items share one array (a training step's
       12.7k frame lists hold a few hundred distinct stacks) */
    int32_t **it_ptr;
    int32_t *it_len, *it_stack, *it_slot;
    uint64_t *it_hash;
    int64_t n_it, cap_it, it_slots;
    int64_t cap_stacks, cap_stack_items;
    int32_t *st_hash;            /* open addressing over stack indices */
    struct Chunk *chunks;
    int8_t *key_code;            /* per string node: which known key it is (K_* + 1), 0 unread */
    int64_t hash_cap;
} Reader;

/* Small non-negative ints are no node: their id is IMM + the value (a snapshot's sizes,
   counts and line numbers are most of its objects; a node each touched megabytes) */
#define IMM (1 << 30)
/* Larger non-negative ints below 2**64 (addresses) are no node either: their id is BIG +
   their index in ``bigs``, 8 bytes each instead of a node's 32 */
#define BIG (1 << 29)
#define TYPE(k) ((k) >= BIG ? T_INT : r->nodes[k].type)
#define INT_OF(k) ((k) >= IMM ? (uint64_t)((k) - IMM) : r->bigs[(k) - BIG])

static int fail(Reader *r, int status, const char *what) {
    if (r->status == OK) {
        r->status = status;
        strncpy(r->error, what, sizeof r->error - 1);
    }
    return -1;
}

static int32_t new_node(Reader *r, uint8_t type) {
    if (r->n_nodes == r->cap_nodes) {
        /* first room for one node per 8 bytes of pickle (a training step's snapshot
           has one per 25): growing by copies touched twice the memory, and fresh
           pages cost more than the walk */
        int64_t cap = r->cap_nodes ? r->cap_nodes * 2 : r->n / 8 + 4096;
        Node *p = realloc(r->nodes, (size_t)cap * sizeof(Node));
        if (!p) return fail(r, NOMEM, "out of memory");
        r->nodes = p;
        r->cap_nodes = cap;
    }
    if (r->n_nodes >= BIG) return fail(r, SHAPE, "too many objects");
    Node *x = &r->nodes[r->n_nodes];
    memset(x, 0, sizeof *x);
    x->type = type;
    return (int32_t)r->n_nodes++;
}

/* Container items live in chunks freed together (a snapshot has tens of thousands of
   small lists and dicts: one malloc each cost more than the walk). A container that
   outgrows its items moves them to twice the room; the old room is not reused. */
typedef struct Chunk { struct Chunk *next; int64_t used, cap; int32_t data[]; } Chunk;

static int32_t *room(Reader *r, int64_t n) {
    Chunk *c = r->chunks;
    if (!c || c->used + n > c->cap) {
        int64_t cap = n > (1 << 20) ? n : (1 << 20);
        c = malloc(sizeof(Chunk) + (size_t)cap * sizeof(int32_t));
        if (!c) { fail(r, NOMEM, "out of memory"); return NULL; }
        c->next = r->chunks;
        c->used = 0;
        c->cap = cap;
        r->chunks = c;
    }
    int32_t *p = c->data + c->used;
    c->used += n;
    return p;
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

static int intern_grow(Reader *r) {
    int64_t slots = r->it_slots ? r->it_slots * 2 : 4096;
    int32_t *p = malloc((size_t)slots * sizeof(int32_t));
    if (!p) return fail(r, NOMEM, "out of memory");
    for (int64_t i = 0; i < slots; i++) p[i] = -1;
    for (int64_t e = 0; e < r->n_it; e++) {
        int64_t s = (int64_t)(r->it_hash[e] & (uint64_t)(slots - 1));
        while (p[s] >= 0) s = (s + 1) & (slots - 1);
        p[s] = (int32_t)e;
    }
    free(r->it_slot);
    r->it_slot = p;
    r->it_slots = slots;
    return 0;
}

/* a fresh list's first items, shared with every list that holds the same ones */
static int intern(Reader *r, int32_t c, const int32_t *src, int64_t count) {
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)count;
    for (int64_t i = 0; i < count; i++) h = mix(h, (uint64_t)src[i]);
    if ((r->n_it + 1) * 2 > r->it_slots && intern_grow(r)) return -1;
    int64_t mask = r->it_slots - 1, s = (int64_t)(h & (uint64_t)mask);
    for (; r->it_slot[s] >= 0; s = (s + 1) & mask) {
        int32_t e = r->it_slot[s];
        if (r->it_hash[e] == h && r->it_len[e] == count
            && memcmp(r->it_ptr[e], src, (size_t)count * sizeof(int32_t)) == 0) {
            Node *x = &r->nodes[c];
            x->items = r->it_ptr[e];
            x->len = (int32_t)count;
            x->cap = 0;
            x->tag = e + 1;
            return 0;
        }
    }
    if (r->n_it == r->cap_it) {
        int64_t cap = r->cap_it ? r->cap_it * 2 : 1024;
        void *a = realloc(r->it_ptr, (size_t)cap * sizeof(int32_t *));
        if (a) r->it_ptr = a;
        void *b = realloc(r->it_len, (size_t)cap * sizeof(int32_t));
        if (b) r->it_len = b;
        void *d = realloc(r->it_stack, (size_t)cap * sizeof(int32_t));
        if (d) r->it_stack = d;
        void *e = realloc(r->it_hash, (size_t)cap * sizeof(uint64_t));
        if (e) r->it_hash = e;
        if (!a || !b || !d || !e) return fail(r, NOMEM, "out of memory");
        r->cap_it = cap;
    }
    int32_t *p = room(r, count);
    if (!p) return -1;
    memcpy(p, src, (size_t)count * sizeof(int32_t));
    int64_t e = r->n_it++;
    r->it_ptr[e] = p;
    r->it_len[e] = (int32_t)count;
    r->it_stack[e] = -1;
    r->it_hash[e] = h;
    r->it_slot[s] = (int32_t)e;
    Node *x = &r->nodes[c];
    x->items = p;
    x->len = (int32_t)count;
    x->cap = 0;
    x->tag = (int32_t)e + 1;
    return 0;
}

static int extend(Reader *r, int32_t c, const int32_t *src, int64_t count) {
    Node *x = &r->nodes[c];
    if (count == 0) return 0;  /* an empty APPENDS / SETITEMS (x->items may be NULL) */
    if (x->type == T_LIST && x->len == 0 && count >= 4) return intern(r, c, src, count);
    if (x->len + count > INT32_MAX) return fail(r, SHAPE, "a container past 2**31 items");
    if (x->len + count > x->cap) {
        /* a dict's SETITEMS and a list's APPENDS usually come once: room for them exactly */
        int64_t cap = x->len == 0 ? count : (x->cap ? x->cap * 2 : 4);
        while (cap < x->len + count) cap *= 2;
        int32_t *p = room(r, cap);
        if (!p) return -1;
        x = &r->nodes[c];
        if (x->len) memcpy(p, x->items, (size_t)x->len * sizeof(int32_t));
        x->items = p;
        x->cap = (int32_t)cap;
        x->tag = 0;
    }
    memcpy(x->items + x->len, src, (size_t)count * sizeof(int32_t));
    x->len += count;
    return 0;
}

static int push_item(Reader *r, int32_t c, int32_t item) { return extend(r, c, &item, 1); }

/* ---- the opcode walk ---- */

typedef struct { int32_t *v; int64_t n, cap; } Vec;

static int vgrow(Reader *r, Vec *s, int32_t v) {
    {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        int32_t *p = realloc(s->v, (size_t)cap * sizeof(int32_t));
        if (!p) return fail(r, NOMEM, "out of memory");
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return 0;
}

static inline int vpush(Reader *r, Vec *s, int32_t v) {
    if (__builtin_expect(s->n < s->cap, 1)) { s->v[s->n++] = v; return 0; }
    return vgrow(r, s, v);
}

static inline uint64_t le(const uint8_t *p, int k) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (k == 4) { uint32_t v; memcpy(&v, p, 4); return v; }
    if (k == 1) return p[0];
    if (k == 2) { uint16_t v; memcpy(&v, p, 2); return v; }
    if (k == 8) { uint64_t v; memcpy(&v, p, 8); return v; }
#endif
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Whether a string's bytes are UTF-8 as pickle decodes them ('surrogatepass': encoded
   surrogates pass): a string pickle cannot decode makes the file the Python loader's,
   whatever key holds it */
static int utf8_ok(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        int k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else return 0;
        if (i + k >= n) return 0;  /* the sequence runs past the string */
        if (p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (int j = 2; j <= k; j++) if ((p[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

static int32_t int_node(Reader *r, int64_t v) {
    if (v >= 0 && v < IMM) return (int32_t)(IMM + v);
    int32_t k = new_node(r, T_INT);
    if (k < 0) return k;
    r->nodes[k].neg = v < 0;
    r->nodes[k].u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    return k;
}

/* LONG1: little-endian two's complement of k bytes */
static int32_t long_node(Reader *r, const uint8_t *p, int k) {
    if (k > 0 && k <= 8 && !(p[k - 1] & 0x80)) {  /* the usual: an address, positive */
        uint64_t v = 0;
        memcpy(&v, p, (size_t)k);  /* little-endian bytes, as the host's (x86, arm) */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (v < IMM) return (int32_t)(IMM + v);
        if (r->n_bigs == r->cap_bigs) {
            int64_t cap = r->cap_bigs ? r->cap_bigs * 2 : r->n / 64 + 1024;
            uint64_t *p2 = realloc(r->bigs, (size_t)cap * sizeof(uint64_t));
            if (!p2) return fail(r, NOMEM, "out of memory");
            r->bigs = p2;
            r->cap_bigs = cap;
        }
        if (r->n_bigs >= IMM - BIG) return fail(r, SHAPE, "too many numbers");
        r->bigs[r->n_bigs] = v;
        return (int32_t)(BIG + r->n_bigs++);
#endif
    }
    int32_t id = new_node(r, T_INT);
    if (id < 0 || k == 0) return id;
    Node *x = &r->nodes[id];
    int neg = (p[k - 1] & 0x80) != 0;
    uint8_t mag[256];
    for (int i = 0; i < k; i++) mag[i] = neg ? (uint8_t)~p[i] : p[i];
    if (neg) { /* magnitude = ~v + 1 */
        for (int i = 0; i < k; i++) { if (++mag[i] != 0) break; }
    }
    int top = k;
    while (top > 0 && mag[top - 1] == 0) top--;
    x->neg = (uint8_t)neg;
    if (top > 8) { x->big = 1; return id; }
    x->u = le(mag, top);
    return id;
}

/* (to done: the stack, marks and memo are freed there) */
#define NEED(k) do { if (pos + (k) > r->n) { fail(r, TRUNCATED, "the pickle ends early"); goto done; } } while (0)
/* the stack and the memo hold at most one item per opcode byte: sized so, they never
   grow (untouched pages of a large allocation cost nothing) */
#define SPUSH(x) (st.v[st.n++] = (x), 0)
#define POP(dst) do { if (st.n <= base) { fail(r, MALFORMED, "stack underflow"); goto done; } dst = st.v[--st.n]; } while (0)

static int walk(Reader *r) {
    Vec st = {0}, marks = {0}, memo = {0};
    int64_t pos = 0, base = 0;
    int32_t a, b, c;
    const uint8_t *buf = r->buf;
    st.cap = memo.cap = r->n + 1;
    st.v = malloc((size_t)st.cap * sizeof(int32_t));
    memo.v = malloc((size_t)memo.cap * sizeof(int32_t));
    if (!st.v || !memo.v) { fail(r, NOMEM, "out of memory"); goto done; }
    int stopped = 0, put = 0, memoized = 0;
    while (!stopped) {
        if (pos >= r->n) { fail(r, TRUNCATED, "the pickle ends early"); goto done; }
        uint8_t op = buf[pos++];
        switch (op) {
        case 0x80: NEED(1); pos += 1; break;                     /* PROTO */
        case 0x95: NEED(8); pos += 8; break;                     /* FRAME */
        case '.': stopped = 1; break;                             /* STOP */
        case '}': r->n_dicts++;
                  if ((a = new_node(r, T_DICT)) < 0 || SPUSH(a)) goto done;
                  break;
        case ']': if ((a = new_node(r, T_LIST)) < 0 || SPUSH(a)) goto done;
                  break;
        case ')': if ((a = new_node(r, T_TUPLE)) < 0 || SPUSH(a)) goto done;
                  break;
        case '(': if (vpush(r, &marks, (int32_t)base) || vpush(r, &marks, (int32_t)st.n)) goto done;
                  base = st.n; break;
        case 'N': if ((a = new_node(r, T_NONE)) < 0 || SPUSH(a)) goto done;
                  break;
        case 0x88: case 0x89:
            if ((a = new_node(r, T_BOOL)) < 0) goto done;
            r->nodes[a].u = op == 0x88;
            if (SPUSH(a)) goto done;
            break;
        case 'J': NEED(4); a = int_node(r, (int32_t)(uint32_t)le(buf + pos, 4)); pos += 4;
                  if (a < 0 || SPUSH(a)) goto done;
                  break;
        case 'K': NEED(1); a = int_node(r, buf[pos]); pos += 1;
                  if (a < 0 || SPUSH(a)) goto done;
                  break;
        case 'M': NEED(2); a = int_node(r, (int64_t)le(buf + pos, 2)); pos += 2;
                  if (a < 0 || SPUSH(a)) goto done;
                  break;
        case 0x8a: { NEED(1); int k = buf[pos++]; NEED(k);        /* LONG1 */
                  a = long_node(r, buf + pos, k); pos += k;
                  if (a < 0 || SPUSH(a)) goto done;
                  break; }
        case 'G': NEED(8);                                         /* BINFLOAT, big-endian */
            if ((a = new_node(r, T_FLOAT)) < 0) goto done;
            { uint64_t v = 0; for (int i = 0; i < 8; i++) v = (v << 8) | buf[pos + i];
              r->nodes[a].u = v; }
            pos += 8;
            if (SPUSH(a)) goto done;
            break;
        case 'X': case 0x8c: case 0x8d: {                          /* BINUNICODE (8) / SHORT_ */
            int k = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
            NEED(k);
            uint64_t len = le(buf + pos, k);
            pos += k;
            if (len > (uint64_t)(r->n - pos)) { fail(r, TRUNCATED, "the pickle ends early"); goto done; }
            if (len > INT32_MAX) { fail(r, SHAPE, "a string past 2 GiB"); goto done; }
            if (!utf8_ok(buf + pos, (int64_t)len)) { fail(r, SHAPE, "a string not UTF-8"); goto done; }
            if ((a = new_node(r, T_STR)) < 0) goto done;
            r->nodes[a].u = (uint64_t)pos;
            r->nodes[a].len = (int32_t)len;
            pos += (int64_t)len;
            if (SPUSH(a)) goto done;
            break; }
        case 0x94:                                                 /* MEMOIZE */
            /* MEMOIZE's key is the memo's size: with BINPUT keys beside it that is
               not the array's length, so the two are not taken together */
            if (put) { fail(r, UNSUPPORTED, "MEMOIZE after BINPUT"); goto done; }
            memoized = 1;
            if (st.n <= base) { fail(r, MALFORMED, "memoize of nothing"); goto done; }
            memo.v[memo.n++] = st.v[st.n - 1];
            break;
        case 'q': case 'r': {                                      /* BINPUT, LONG_BINPUT */
            int k = op == 'q' ? 1 : 4;
            NEED(k);
            uint64_t idx = le(buf + pos, k);
            pos += k;
            if (memoized) { fail(r, UNSUPPORTED, "BINPUT after MEMOIZE"); goto done; }
            put = 1;
            if (st.n <= base || idx > 100000000) { fail(r, MALFORMED, "bad put"); goto done; }
            while ((uint64_t)memo.n <= idx) if (vpush(r, &memo, -1)) goto done;
            memo.v[idx] = st.v[st.n - 1];
            break; }
        case 'h': case 'j': {                                      /* BINGET, LONG_BINGET */
            /* a stack's frames are a run of these: taken in one loop, not one switch each */
            for (;;) {
                uint64_t idx;
                if (op == 'h') { NEED(1); idx = buf[pos++]; }
                else { NEED(4); idx = le(buf + pos, 4); pos += 4; }
                int32_t got;
                if (idx >= (uint64_t)memo.n || (got = memo.v[idx]) < 0) {
                    fail(r, MALFORMED, "memo key not found"); goto done; }
                st.v[st.n++] = got;
                if (pos >= r->n || (buf[pos] != 'h' && buf[pos] != 'j')) break;
                op = buf[pos++];
            }
            break; }
        case 'a':                                                   /* APPEND */
            POP(b);
            if (st.n <= base) { fail(r, MALFORMED, "append to nothing"); goto done; }
            a = st.v[st.n - 1];
            if (TYPE(a) != T_LIST) { fail(r, MALFORMED, "append to a non-list"); goto done; }
            if (push_item(r, a, b)) goto done;
            break;
        case 'e': case 'u': case 't': {                            /* APPENDS, SETITEMS, TUPLE */
            if (marks.n < 2) { fail(r, MALFORMED, "no mark"); goto done; }
            int64_t from = base;
            int64_t count = st.n - from;
            int64_t outer = marks.v[--marks.n];
            base = marks.v[--marks.n];
            (void)outer;
            if (op == 't') {
                if ((c = new_node(r, T_TUPLE)) < 0) goto done;
                if (extend(r, c, st.v + from, count)) goto done;
                st.n = from;
                if (SPUSH(c)) goto done;
                break;
            }
            if (from <= base || from < 1) { fail(r, MALFORMED, "nothing to add to"); goto done; }
            a = st.v[from - 1];
            if (op == 'e' ? TYPE(a) != T_LIST
                          : (TYPE(a) != T_DICT || count % 2)) {
                fail(r, MALFORMED, "items added to the wrong kind of object"); goto done; }
            if (extend(r, a, st.v + from, count)) goto done;
            st.n = from;
            break; }
        case 's':                                                   /* SETITEM */
            POP(b); POP(c);
            if (st.n <= base || TYPE(st.v[st.n - 1]) != T_DICT) {
                fail(r, MALFORMED, "setitem on a non-dict"); goto done; }
            if (push_item(r, st.v[st.n - 1], c) || push_item(r, st.v[st.n - 1], b)) goto done;
            break;
        case 0x85: case 0x86: case 0x87: {                         /* TUPLE1..3 */
            int k = op - 0x84;
            if (st.n - base < k) { fail(r, MALFORMED, "stack underflow"); goto done; }
            if ((c = new_node(r, T_TUPLE)) < 0) goto done;
            for (int i = 0; i < k; i++) if (push_item(r, c, st.v[st.n - k + i])) goto done;
            st.n -= k;
            if (SPUSH(c)) goto done;
            break; }
        case 'c': fail(r, REFUSED, "refused: GLOBAL opcode (names code to run)"); goto done;
        case 0x93: fail(r, REFUSED, "refused: STACK_GLOBAL opcode (names code to run)"); goto done;
        case 'R': fail(r, REFUSED, "refused: REDUCE opcode (calls code)"); goto done;
        case 'b': fail(r, REFUSED, "refused: BUILD opcode (calls code)"); goto done;
        case 'i': case 'o': case 0x81: case 0x92:
            fail(r, REFUSED, "refused: an object-building opcode (calls code)"); goto done;
        case 'P': case 'Q': fail(r, REFUSED, "refused: a persistent id"); goto done;
        case 0x82: case 0x83: case 0x84: fail(r, REFUSED, "refused: an extension code"); goto done;
        default:
            fail(r, UNSUPPORTED, "an opcode this reader does not take");
            goto done;
        }
    }
    if (st.n != 1 || marks.n) { fail(r, MALFORMED, "not one object at STOP"); goto done; }
    r->top = st.v[0];
done:
    free(st.v); free(marks.v); free(memo.v);
    return r->status == OK ? 0 : -1;
}

/* ---- taking the columns ---- */

static int str_is(Reader *r, int32_t k, const char *s) {
    if (k >= BIG) return 0;
    Node *x = &r->nodes[k];
    size_t n = strlen(s);
    return x->type == T_STR && (size_t)x->len == n && memcmp(r->buf + x->u, s, n) == 0;
}

/* the value of key ``s`` in dict ``d`` (the last one: pickle's later SETITEM wins), or -1 */
static int32_t get(Reader *r, int32_t d, const char *s) {
    Node *x = &r->nodes[d];
    for (int64_t i = x->len - 2; i >= 0; i -= 2)
        if (str_is(r, x->items[i], s)) return x->items[i + 1];
    return -1;
}

enum { K_OTHER, K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_TIME, K_FRAMES, K_DEVICE_FREE, K_TORCH_CAT, K_FILENAME, K_NAME, K_LINE, K_ADDRESS, K_TOTAL, K_ALLOCATED, K_ACTIVE, K_REQUESTED, K_DEVICE, K_SEGTYPE, K_POOL, K_EXPANDABLE, K_BLOCKS, K_STATE,
       /* values read by name: actions (columns.py's ACTIONS order), block states */
       K_ACTION0, K_STATE0 = K_ACTION0 + 11, K_N = K_STATE0 + 3 };
static const char *KEYS[K_N] = {"", "action", "addr", "size", "stream", "time_us", "frames", "device_free", "torch_category", "filename", "name", "line", "address", "total_size", "allocated_size", "active_size", "requested_size", "device", "segment_type", "segment_pool_id", "is_expandable", "blocks", "state",
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom", "user_defined", "free",
    "active_allocated", "active_pending_free", "inactive"};

/* which known key string node ``k`` is; each key node is read once (pickle memoizes
   keys, so 19k entries share one "action" node) */
static int key_read(Reader *r, int32_t k);

static inline int key_of(Reader *r, int32_t k) {
    if (k < BIG && r->key_code[k]) return r->key_code[k] - 1;
    return key_read(r, k);
}

static int key_read(Reader *r, int32_t k) {
    if (TYPE(k) != T_STR) return K_OTHER;
    int c = K_OTHER;
    for (int i = 1; i < K_N; i++) if (str_is(r, k, KEYS[i])) { c = i; break; }
    r->key_code[k] = (int8_t)(c + 1);
    return c;
}

/* the known keys' values of dict ``d`` (-1: absent; the last one wins, as in pickle) */
static void fields(Reader *r, int32_t d, int32_t *out) {
    for (int i = 0; i < K_N; i++) out[i] = -1;
    Node *x = &r->nodes[d];
    for (int64_t i = 0; i + 1 < x->len; i += 2) out[key_of(r, x->items[i])] = x->items[i + 1];
}

/* an int node in [0, hi] (hi < 2**64), not a bool */
static int uint_in(Reader *r, int32_t k, uint64_t hi, uint64_t *out) {
    if (k < 0) return 0;
    if (k >= BIG) {
        uint64_t v = INT_OF(k);
        if (v > hi) return 0;
        *out = v;
        return 1;
    }
    Node *x = &r->nodes[k];
    if (x->type != T_INT || x->big || (x->neg && x->u) || x->u > hi) return 0;
    *out = x->u;
    return 1;
}

#define MAX_BYTES (1ULL << 50)
#define MAX_U64 UINT64_MAX

static int check_frame(Reader *r, int32_t f) {
    if (TYPE(f) != T_DICT) return fail(r, SHAPE, "a frame is not a dict");
    if (r->frame_of[f]) return r->frame_of[f] - 1;
    Node *x = &r->nodes[f];
    int64_t k = r->n_frames++;
    r->f_file[k] = r->f_name[k] = -1;
    r->f_file_len[k] = r->f_name_len[k] = r->f_line[k] = 0;
    r->f_has[k] = 0;
    for (int64_t i = 0; i < x->len; i += 2) {
        int key = key_of(r, x->items[i]);
        int32_t v = x->items[i + 1];
        if (key == K_LINE && v >= BIG) {  /* the usual line number */
            if (INT_OF(v) > (uint64_t)INT64_MAX) return fail(r, SHAPE, "a line past 2**63");
            r->f_line[k] = (int64_t)INT_OF(v);
            r->f_has[k] |= 4;
            continue;
        }
        if (v >= BIG) return fail(r, SHAPE, "a frame's name is not text");
        Node *vx = &r->nodes[v];
        if (key == K_FILENAME || key == K_NAME) {
            if (vx->type != T_STR) return fail(r, SHAPE, "a frame's name is not text");
            int file = key == K_FILENAME;
            (file ? r->f_file : r->f_name)[k] = (int64_t)vx->u;
            (file ? r->f_file_len : r->f_name_len)[k] = vx->len;
            r->f_has[k] |= file ? 1 : 2;
        } else if (key == K_LINE) {
            if (vx->type != T_INT || vx->big || vx->u > (uint64_t)INT64_MAX)
                return fail(r, SHAPE, "a frame's line is not a number");
            r->f_line[k] = vx->neg ? -(int64_t)vx->u : (int64_t)vx->u;
            r->f_has[k] |= 4;
        } else {
            return fail(r, SHAPE, "a frame has another key");
        }
    }
    r->frame_of[f] = (int32_t)k + 1;
    return (int)k;
}


static int grow_hash(Reader *r);

/* the stack index of frames list ``l`` (lists holding the same frame dicts share one) */
static int32_t stack_id(Reader *r, int32_t l) {
    if (l >= BIG) return fail(r, SHAPE, "frames is not a list");
    if (l >= 0 && r->stack_of[l]) return r->stack_of[l] - 1;
    Node *x = l >= 0 ? &r->nodes[l] : NULL;
    int32_t tag = x && x->type == T_LIST ? x->tag : 0;
    if (tag && r->it_stack[tag - 1] >= 0) return r->it_stack[tag - 1];
    if (x && x->type != T_LIST) return fail(r, SHAPE, "frames is not a list");
    int64_t n = x ? x->len : 0;
    if (r->n_stack_items + n > r->cap_stack_items) {
        int64_t cap = r->cap_stack_items * 2 + n + 1024;
        int32_t *p = realloc(r->st_items, (size_t)cap * sizeof(int32_t));
        if (!p) return fail(r, NOMEM, "out of memory");
        r->st_items = p;
        r->cap_stack_items = cap;
    }
    uint64_t h = (uint64_t)n;
    int32_t *mine = r->st_items + r->n_stack_items;
    for (int64_t i = 0; i < n; i++) {
        int f = check_frame(r, x->items[i]);
        if (f < 0) return -1;
        mine[i] = f;
        h = mix(h, (uint64_t)f);
    }
    if ((r->n_stacks + 1) * 2 > r->hash_cap && grow_hash(r)) return -1;
    uint64_t mask = (uint64_t)r->hash_cap - 1;
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        int32_t s = r->st_hash[slot];
        if (s < 0) break;
        int64_t len = r->st_start[s + 1] - r->st_start[s];
        /* (an empty stack compares without memcmp: st_items may be NULL then) */
        if (len == n && (n == 0 || memcmp(r->st_items + r->st_start[s], mine, (size_t)n * 4) == 0)) {
            if (l >= 0) r->stack_of[l] = s + 1;
            if (tag) r->it_stack[tag - 1] = s;
            return s;
        }
    }
    if (r->n_stacks + 2 > r->cap_stacks) {
        int64_t cap = r->cap_stacks * 2 + 256;
        int32_t *p = realloc(r->st_start, (size_t)cap * sizeof(int32_t));
        if (!p) return fail(r, NOMEM, "out of memory");
        r->st_start = p;
        r->cap_stacks = cap;
    }
    int32_t s = (int32_t)r->n_stacks++;
    r->n_stack_items += n;
    r->st_start[s + 1] = (int32_t)r->n_stack_items;
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        if (r->st_hash[slot] < 0) { r->st_hash[slot] = s; break; }
    }
    if (l >= 0) r->stack_of[l] = s + 1;
    if (tag) r->it_stack[tag - 1] = s;
    return s;
}

static uint64_t stack_hash(Reader *r, int32_t s) {
    int32_t a = r->st_start[s], b = r->st_start[s + 1];
    uint64_t h = (uint64_t)(b - a);
    for (int32_t i = a; i < b; i++) h = mix(h, (uint64_t)r->st_items[i]);
    return h;
}

static int grow_hash(Reader *r) {
    int64_t cap = r->hash_cap ? r->hash_cap * 2 : 1024;
    int32_t *p = malloc((size_t)cap * sizeof(int32_t));
    if (!p) return fail(r, NOMEM, "out of memory");
    for (int64_t i = 0; i < cap; i++) p[i] = -1;
    free(r->st_hash);
    r->st_hash = p;
    r->hash_cap = cap;
    for (int32_t s = 0; s < r->n_stacks; s++) {
        for (uint64_t slot = stack_hash(r, s) & (uint64_t)(cap - 1);;
             slot = (slot + 1) & (uint64_t)(cap - 1)) {
            if (p[slot] < 0) { p[slot] = s; break; }
        }
    }
    return 0;
}


#define ALLOC(ptr, n) do { (ptr) = malloc(((size_t)(n) + 1) * sizeof(*(ptr))); \
    if (!(ptr)) return fail(r, NOMEM, "out of memory"); } while (0)

static int take(Reader *r) {
    if (TYPE(r->top) != T_DICT) return fail(r, SHAPE, "not a dict");
    int32_t segs = get(r, r->top, "segments"), traces = get(r, r->top, "device_traces");
    if (segs < 0 && traces < 0) return fail(r, SHAPE, "neither segments nor device_traces");
    if (segs >= 0 && TYPE(segs) != T_LIST) return fail(r, SHAPE, "segments not a list");
    if (traces >= 0 && TYPE(traces) == T_NONE) traces = -1;
    if (traces >= 0 && TYPE(traces) != T_LIST) return fail(r, SHAPE, "traces not a list");
    /* zeroed by calloc (fresh pages: only the entries used are touched) */
    r->key_code = calloc((size_t)r->n_nodes + 1, 1);
    r->frame_of = calloc((size_t)r->n_nodes + 1, sizeof(int32_t));
    r->stack_of = calloc((size_t)r->n_nodes + 1, sizeof(int32_t));
    if (!r->key_code || !r->frame_of || !r->stack_of) return fail(r, NOMEM, "out of memory");
    int32_t F[K_N];
    int64_t n_frames_max = r->n_dicts;  /* every frame is a dict */
    ALLOC(r->f_file, n_frames_max); ALLOC(r->f_file_len, n_frames_max);
    ALLOC(r->f_name, n_frames_max); ALLOC(r->f_name_len, n_frames_max);
    ALLOC(r->f_line, n_frames_max); ALLOC(r->f_has, n_frames_max);
    r->cap_stacks = 256;
    ALLOC(r->st_start, r->cap_stacks);
    r->st_start[0] = 0;
    /* segments and their blocks */
    int64_t ns = segs >= 0 ? r->nodes[segs].len : 0, nb = 0;
    for (int64_t i = 0; i < ns; i++) {
        int32_t s = r->nodes[segs].items[i];
        if (TYPE(s) != T_DICT) return fail(r, SHAPE, "a segment is not a dict");
        fields(r, s, F);
        int32_t bl = F[K_BLOCKS];
        if (bl < 0 || TYPE(bl) != T_LIST) return fail(r, SHAPE, "blocks not a list");
        nb += r->nodes[bl].len;
    }
    r->n_segments = ns;
    r->n_blocks = nb;
    ALLOC(r->s_addr, ns); ALLOC(r->s_total, ns); ALLOC(r->s_device, ns);
    ALLOC(r->s_first, ns); ALLOC(r->s_count, ns); ALLOC(r->s_stack, ns);
    ALLOC(r->b_addr, nb); ALLOC(r->b_size, nb); ALLOC(r->b_state, nb); ALLOC(r->b_stack, nb);
    int64_t at = 0;
    for (int64_t i = 0; i < ns; i++) {
        int32_t s = r->nodes[segs].items[i];
        fields(r, s, F);
        int32_t bl = F[K_BLOCKS];
        uint64_t v, total;
        if (!uint_in(r, F[K_ADDRESS], MAX_U64, &r->s_addr[i])) return fail(r, SHAPE, "segment address");
        if (!uint_in(r, F[K_TOTAL], MAX_BYTES, &total)) return fail(r, SHAPE, "segment total_size");
        r->s_total[i] = (int64_t)total;
        if (!uint_in(r, F[K_ALLOCATED], MAX_U64, &v)
            || !uint_in(r, F[K_ACTIVE], MAX_U64, &v)
            || !uint_in(r, F[K_REQUESTED], MAX_U64, &v)
            || !uint_in(r, F[K_STREAM], MAX_U64, &v))
            return fail(r, SHAPE, "segment sizes or stream");
        if (!uint_in(r, F[K_DEVICE], 1ULL << 31, &v)) return fail(r, SHAPE, "segment device");
        r->s_device[i] = (int32_t)v;
        int32_t ty = F[K_SEGTYPE];
        if (ty < 0 || !(str_is(r, ty, "small") || str_is(r, ty, "large")))
            return fail(r, SHAPE, "segment_type");
        if (F[K_POOL] < 0 || F[K_EXPANDABLE] < 0)
            return fail(r, SHAPE, "segment pool or expandable missing");
        int32_t fr = F[K_FRAMES];
        if (fr < 0 || (r->s_stack[i] = stack_id(r, fr)) < 0) return fail(r, SHAPE, "segment frames");
        r->s_first[i] = (int32_t)at;
        r->s_count[i] = (int32_t)r->nodes[bl].len;
        for (int64_t j = 0; j < r->nodes[bl].len; j++, at++) {
            int32_t b = r->nodes[bl].items[j];
            if (TYPE(b) != T_DICT) return fail(r, SHAPE, "a block is not a dict");
            fields(r, b, F);
            uint64_t size;
            if (!uint_in(r, F[K_SIZE], MAX_BYTES, &size)
                || !uint_in(r, F[K_REQUESTED], MAX_BYTES, &v)
                || !uint_in(r, F[K_ADDRESS], MAX_U64, &r->b_addr[at]))
                return fail(r, SHAPE, "block size or address");
            r->b_size[at] = (int64_t)size;
            int32_t stt = F[K_STATE];
            int sc = stt >= 0 ? key_of(r, stt) - K_STATE0 : -1;
            r->b_state[at] = (int8_t)(sc >= 0 && sc < 3 ? sc : -1);
            if (r->b_state[at] < 0) return fail(r, SHAPE, "block state");
            int32_t bf = F[K_FRAMES];
            if (bf < 0 || (r->b_stack[at] = stack_id(r, bf)) < 0) return fail(r, SHAPE, "block frames");
        }
    }
    /* the device traces */
    int64_t nd = traces >= 0 ? r->nodes[traces].len : 0, ne = 0;
    for (int64_t d = 0; d < nd; d++) {
        int32_t t = r->nodes[traces].items[d];
        if (TYPE(t) != T_LIST) return fail(r, SHAPE, "a trace is not a list");
        ne += r->nodes[t].len;
    }
    r->n_entries = ne;
    ALLOC(r->e_device, ne); ALLOC(r->e_stack, ne); ALLOC(r->e_action, ne);
    ALLOC(r->e_addr, ne); ALLOC(r->e_size, ne); ALLOC(r->e_time, ne);
    at = 0;
    for (int64_t d = 0; d < nd; d++) {
        int32_t t = r->nodes[traces].items[d];
        for (int64_t j = 0; j < r->nodes[t].len; j++, at++) {
            int32_t e = r->nodes[t].items[j], k;
            uint64_t v;
            if (TYPE(e) != T_DICT) return fail(r, SHAPE, "an entry is not a dict");
            fields(r, e, F);
            r->e_device[at] = (int32_t)d;
            int32_t act = F[K_ACTION];
            if (act < 0 || TYPE(act) != T_STR) return fail(r, SHAPE, "entry action");
            int ac = key_of(r, act) - K_ACTION0;
            r->e_action[at] = (int8_t)(ac >= 0 && ac < 11 ? ac : -1);
            k = F[K_ADDR];
            if (k < 0) r->e_addr[at] = 0;
            else if (!uint_in(r, k, MAX_U64, &r->e_addr[at])) return fail(r, SHAPE, "entry addr");
            k = F[K_SIZE];
            if (k < 0) v = 0;
            else if (!uint_in(r, k, MAX_BYTES, &v)) return fail(r, SHAPE, "entry size");
            r->e_size[at] = (int64_t)v;
            k = F[K_STREAM];
            if (k >= 0 && !uint_in(r, k, MAX_U64, &v)) return fail(r, SHAPE, "entry stream");
            k = F[K_TIME];
            r->e_time[at] = 0;
            if (k >= 0 && TYPE(k) != T_NONE) {
                if (!uint_in(r, k, (uint64_t)INT64_MAX, &v)) return fail(r, SHAPE, "entry time");
                r->e_time[at] = (int64_t)v;
            }
            k = F[K_DEVICE_FREE];
            if (k >= 0 && !uint_in(r, k, MAX_U64, &v)) return fail(r, SHAPE, "entry device_free");
            if (F[K_TORCH_CAT] >= 0) return fail(r, SHAPE, "torch categories");
            k = F[K_FRAMES];
            if ((r->e_stack[at] = stack_id(r, k)) < 0) return fail(r, SHAPE, "entry frames");
        }
    }
    return 0;
}

/* ---- the ctypes interface ---- */

static void free_nodes(Reader *r) {
    while (r->chunks) {
        struct Chunk *next = r->chunks->next;
        free(r->chunks);
        r->chunks = next;
    }
    free(r->nodes);
    r->nodes = NULL;
    free(r->bigs);
    r->bigs = NULL;
}

void *sr_read(const uint8_t *buf, int64_t n) {
    Reader *r = calloc(1, sizeof(Reader));
    if (!r) return NULL;
    r->buf = buf;
    r->n = n;
    r->top = -1;
    if (walk(r) == 0) take(r);
    return r;
}

void sr_free(void *p) {
    Reader *r = p;
    if (!r) return;
    free_nodes(r);
    void *arrays[] = {r->e_device, r->e_stack, r->e_action, r->e_addr, r->e_size, r->e_time,
                      r->s_addr, r->s_total, r->s_device, r->s_first, r->s_count, r->s_stack,
                      r->b_addr, r->b_size, r->b_state, r->b_stack, r->f_file, r->f_file_len,
                      r->f_name, r->f_name_len, r->f_line, r->f_has, r->st_start, r->st_items,
                      r->frame_of, r->stack_of, r->st_hash, r->key_code,
                      r->it_ptr, r->it_len, r->it_stack, r->it_slot, r->it_hash};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) free(arrays[i]);
    free(r);
}

/* The tree and the maps freed, the columns kept (numpy reads them in place until the
   columns are dropped, then sr_free) */
void sr_free_tree(void *p) {
    Reader *r = p;
    free_nodes(r);
    void *maps[] = {r->frame_of, r->stack_of, r->st_hash, r->key_code, r->it_ptr, r->it_len,
                    r->it_stack, r->it_slot, r->it_hash};
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++) free(maps[i]);
    r->frame_of = r->stack_of = r->st_hash = r->it_len = r->it_stack = r->it_slot = NULL;
    r->key_code = NULL;
    r->it_ptr = NULL;
    r->it_hash = NULL;
}

int sr_status(void *p) { return ((Reader *)p)->status; }
const char *sr_error(void *p) { return ((Reader *)p)->error; }
int32_t sr_top(void *p) { return ((Reader *)p)->top; }

/* counts: 0 entries, 1 segments, 2 blocks, 3 frames, 4 stacks, 5 stack items */
int64_t sr_count(void *p, int what) {
    Reader *r = p;
    int64_t c[] = {r->n_entries, r->n_segments, r->n_blocks, r->n_frames, r->n_stacks,
                   r->n_stack_items};
    return what >= 0 && what < 6 ? c[what] : -1;
}

/* column pointers, in the order native.py's COLUMNS names them */
void *sr_column(void *p, int k) {
    Reader *r = p;
    void *c[] = {r->e_device, r->e_action, r->e_addr, r->e_size, r->e_time, r->e_stack,
                 r->s_addr, r->s_total, r->s_device, r->s_first, r->s_count, r->s_stack,
                 r->b_addr, r->b_size, r->b_state, r->b_stack,
                 r->f_file, r->f_file_len, r->f_name, r->f_name_len, r->f_line, r->f_has,
                 r->st_start, r->st_items};
    return k >= 0 && k < (int)(sizeof c / sizeof *c) ? c[k] : NULL;
}

/* generic access to small parts (allocator_settings ...): type, length, item, value */
int sr_node_type(void *p, int32_t k) { Reader *r = p; return TYPE(k); }
int64_t sr_node_len(void *p, int32_t k) { return ((Reader *)p)->nodes[k].len; }
int32_t sr_node_item(void *p, int32_t k, int64_t i) { return ((Reader *)p)->nodes[k].items[i]; }
uint64_t sr_node_u(void *p, int32_t k) {
    Reader *r = p;
    return k >= BIG ? INT_OF(k) : r->nodes[k].u;
}
int sr_node_flags(void *p, int32_t k) {
    if (k >= BIG) return 0;
    Node *x = &((Reader *)p)->nodes[k];
    return x->neg | (x->big << 1);
}
int32_t sr_get(void *p, int32_t d, const char *key) {
    Reader *r = p;
    if (d < 0 || TYPE(d) != T_DICT) return -1;
    return get(r, d, key);
}

/* The replay's pairing (timeline.build_timeline's walk): per entry what it does to the
   allocated level, and for a free the alloc it frees.
   kind: 0 no point, 1 alloc, 2 free of an alloc in the trace, 3 free of a block from
   before the trace, 4 free_completed after its free_requested (no change),
   5 segment added, 6 segment removed.
   Then for each of ``n_q`` addresses whether an alloc or a free names it (``touched``:
   the segments' blocks the trace never touches are memory from before the window). */
typedef struct { uint64_t *keys; int32_t *slot_of; int64_t cap; int32_t used, bits; } AddrMap;

static int64_t addr_find(const AddrMap *m, uint64_t a) {
    /* the product's top bits: addresses are multiples of 512 or 2 MiB, low bits alike */
    int64_t s = (int64_t)((a * 0x9e3779b97f4a7c15ULL) >> (64 - m->bits));
    while (m->slot_of[s] >= 0 && m->keys[s] != a) s = (s + 1) & (m->cap - 1);
    return s;
}

static int addr_grow(AddrMap *m) {
    AddrMap g = {NULL, NULL, m->cap ? m->cap * 2 : 4096, m->used, m->cap ? m->bits + 1 : 12};
    g.keys = malloc((size_t)g.cap * sizeof(uint64_t));
    g.slot_of = malloc((size_t)g.cap * sizeof(int32_t));
    if (!g.keys || !g.slot_of) { free(g.keys); free(g.slot_of); return -1; }
    for (int64_t i = 0; i < g.cap; i++) g.slot_of[i] = -1;
    for (int64_t i = 0; i < m->cap; i++) {
        if (m->slot_of[i] < 0) continue;
        int64_t s = addr_find(&g, m->keys[i]);
        g.keys[s] = m->keys[i];
        g.slot_of[s] = m->slot_of[i];
    }
    free(m->keys); free(m->slot_of);
    *m = g;
    return 0;
}

int sr_pair(int64_t n, const int8_t *action, const uint64_t *addr, int8_t *kind,
            int32_t *partner, int64_t n_q, const uint64_t *q, int8_t *touched) {
    AddrMap m = {0};
    int32_t *live = malloc((size_t)(n + 1) * sizeof(int32_t));
    uint8_t *pending = calloc((size_t)n + 1, 1);
    int bad = !live || !pending || addr_grow(&m);
    for (int64_t i = 0; i < n && !bad; i++) {
        int8_t a = action[i];
        partner[i] = -1;
        kind[i] = 0;
        if (a == 3 || a == 5) { kind[i] = 5; continue; }
        if (a == 4 || a == 6) { kind[i] = 6; continue; }
        if (a != 0 && a != 1 && a != 2 && a != 10) continue;
        if ((int64_t)(m.used + 1) * 2 > m.cap && addr_grow(&m)) { bad = 1; break; }
        int64_t s = addr_find(&m, addr[i]);
        if (m.slot_of[s] < 0) { m.keys[s] = addr[i]; m.slot_of[s] = m.used; live[m.used] = -1; m.used++; }
        int32_t k = m.slot_of[s];
        if (a == 0) { live[k] = (int32_t)i; kind[i] = 1; continue; }
        if ((a == 2 || a == 10) && pending[k]) { pending[k] = 0; kind[i] = 4; continue; }
        if (a == 1) pending[k] = 1;
        if (live[k] >= 0) { kind[i] = 2; partner[i] = live[k]; live[k] = -1; }
        else kind[i] = 3;
    }
    for (int64_t j = 0; j < n_q && !bad; j++) touched[j] = m.slot_of[addr_find(&m, q[j])] >= 0;
    free(m.keys); free(m.slot_of); free(live); free(pending);
    return bad ? -1 : 0;
}
