/*
 * Kineto trace JSON -> columns, without one Python object per event.
 *
 * Why C: the typed msgspec decode plus pouring its records into numpy costs
 * about 3 us per event, most of it allocating Python objects that are thrown
 * away as soon as their value is in a column. This scanner reads the
 * ``traceEvents`` array once and writes numbers straight into columns and
 * strings as codes into per-column intern tables (keys are spans of the input,
 * nothing is copied). It only accepts the canonical shape of a Kineto trace:
 * anything else (a value of an unexpected type, an escaped key, a phase the
 * ingest drops, a number that does not fit) returns TL_ODD and the caller uses
 * the Python path, which knows every odd case and counts what it drops. So
 * this file decides nothing about meaning; the Python reader stays the reference
 * and the tests check both paths give equal tables on every shared trace.
 *
 * Loaded with ctypes (no Python C API): built by hatch_build.py with the
 * system C compiler; without it torchlens runs the Python path only.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TL_OK 0
#define TL_ODD 1
#define TL_NOMEM 2

/*
 * The column layout, written once per language: here as X(ENUM, "name"),
 * in Python as schema.SCANNER_COLUMNS (names equal to the Event/Args fields
 * that fill them). tl_layout() reports this side, and the Python loader
 * refuses a library whose layout differs from its own. Bump TL_ABI when a
 * tl_* function's signature changes.
 */
#define TL_ABI "1"
/* Text columns: values interned; the tag tells how a key's bytes are read. */
#define TEXT_COLUMNS(X) X(T_PH, "ph") X(T_NAME, "name") X(T_CAT, "cat") \
    X(T_PID, "pid") X(T_TID, "tid") X(T_INPUT_DIMS, "input_dims") \
    X(T_INPUT_TYPES, "input_types") X(T_CALL_STACK, "call_stack") \
    X(T_COLLECTIVE, "collective") X(T_DTYPE, "dtype") X(T_PG_NAME, "pg_name") \
    X(T_PG_ID, "pg_id") X(T_META_NAME, "meta_name") X(T_LABELS, "labels")
#define INT_COLUMNS(X) X(I_PID, "pid") X(I_TID, "tid") X(I_ID, "id") \
    X(I_EXT, "external_id") X(I_EXT_LC, "external_id_lc") X(I_CORR, "correlation") \
    X(I_DEVICE, "device") X(I_STREAM, "stream") X(I_BYTES, "bytes") \
    X(I_IN_NELEMS, "in_nelems") X(I_OUT_NELEMS, "out_nelems") \
    X(I_GROUP_SIZE, "group_size") X(I_ADDR, "addr") X(I_MEM_BYTES, "mem_bytes") \
    X(I_TOTAL_ALLOC, "total_allocated") X(I_TOTAL_RES, "total_reserved") \
    X(I_DEVICE_TYPE, "device_type") X(I_DEVICE_ID, "device_id")
#define FLOAT_COLUMNS(X) X(F_TS, "ts") X(F_DUR, "dur") X(F_FLOPS, "flops") \
    X(F_FLOPS_UC, "flops_uc")
#define COLUMN_ENUM(e, name) e,
#define COLUMN_NAME(e, name) name,
enum { TEXT_COLUMNS(COLUMN_ENUM) N_TEXT };
enum { INT_COLUMNS(COLUMN_ENUM) N_INT };
enum { FLOAT_COLUMNS(COLUMN_ENUM) N_FLOAT };
static const char *const TEXT_NAMES[] = { TEXT_COLUMNS(COLUMN_NAME) };
static const char *const INT_NAMES[] = { INT_COLUMNS(COLUMN_NAME) };
static const char *const FLOAT_NAMES[] = { FLOAT_COLUMNS(COLUMN_NAME) };

/* How a field's value is taken. */
enum {
    K_STR,    /* string or null (ph, name, cat) */
    K_VALTXT, /* string, int or null, interned as text (_Val text columns) */
    K_ID,     /* int -> int column, string -> text column, null */
    K_INT,    /* int or null */
    K_FLOAT,  /* number or null */
    K_RAW,    /* any JSON value, interned as its exact bytes */
    K_ARGS    /* the args object */
};

typedef struct { const char *key; int klen; int kind; int col; int col2; } Field;

#define F(k, kind, col, col2) { k, (int)sizeof(k) - 1, kind, col, col2 }
static const Field EVENT_FIELDS[] = {
    F("ph", K_STR, T_PH, 0), F("name", K_STR, T_NAME, 0), F("cat", K_STR, T_CAT, 0),
    F("ts", K_FLOAT, F_TS, 0), F("dur", K_FLOAT, F_DUR, 0),
    F("pid", K_ID, I_PID, T_PID), F("tid", K_ID, I_TID, T_TID),
    F("id", K_INT, I_ID, 0), F("args", K_ARGS, 0, 0),
};
static const Field ARG_FIELDS[] = {
    F("External id", K_INT, I_EXT, 0), F("external id", K_INT, I_EXT_LC, 0),
    F("correlation", K_INT, I_CORR, 0), F("device", K_INT, I_DEVICE, 0),
    F("stream", K_INT, I_STREAM, 0), F("Input Dims", K_RAW, T_INPUT_DIMS, 0),
    F("Input type", K_RAW, T_INPUT_TYPES, 0), F("Call stack", K_VALTXT, T_CALL_STACK, 0),
    F("flops", K_FLOAT, F_FLOPS, 0), F("FLOPs", K_FLOAT, F_FLOPS_UC, 0),
    F("bytes", K_INT, I_BYTES, 0), F("Collective name", K_VALTXT, T_COLLECTIVE, 0),
    F("dtype", K_VALTXT, T_DTYPE, 0), F("Process Group Name", K_VALTXT, T_PG_NAME, 0),
    F("Process Group ID", K_VALTXT, T_PG_ID, 0), F("In msg nelems", K_INT, I_IN_NELEMS, 0),
    F("Out msg nelems", K_INT, I_OUT_NELEMS, 0), F("Group size", K_INT, I_GROUP_SIZE, 0),
    F("Addr", K_INT, I_ADDR, 0), F("Bytes", K_INT, I_MEM_BYTES, 0),
    F("Total Allocated", K_INT, I_TOTAL_ALLOC, 0), F("Total Reserved", K_INT, I_TOTAL_RES, 0),
    F("Device Type", K_INT, I_DEVICE_TYPE, 0), F("Device Id", K_INT, I_DEVICE_ID, 0),
    F("name", K_VALTXT, T_META_NAME, 0), F("labels", K_VALTXT, T_LABELS, 0),
};
#undef F
#define N_EVENT_FIELDS (sizeof(EVENT_FIELDS) / sizeof(EVENT_FIELDS[0]))
#define N_ARG_FIELDS (sizeof(ARG_FIELDS) / sizeof(ARG_FIELDS[0]))

#define MAX_TOP 64

/* One intern table: open addressing over key spans of the input. */
typedef struct {
    int32_t *slots;   /* code + 1, 0 = empty */
    int64_t cap;      /* power of two */
    int64_t n;
    int64_t *off;     /* per code: key offset in the input */
    int64_t *len;     /* per code: key length */
    char *tag;        /* per code: 's' string body, 'i' int literal, 'r' raw value */
    uint64_t *hash;
    int64_t kcap;
} Intern;

typedef struct {
    const char *buf;
    int64_t size;
    int64_t rows, cap;
    int32_t *text[N_TEXT];
    int64_t *ints[N_INT];
    uint8_t *ihas[N_INT];
    double *floats[N_FLOAT];
    uint8_t *fhas[N_FLOAT];
    Intern intern[N_TEXT];
    int64_t events_start, events_end;  /* span of the traceEvents array */
    /* The other top-level members, as (key, value) spans: the caller decodes
       just these small values instead of a copy of the file without events. */
    int64_t top[MAX_TOP][4];
    int n_top;
    uint8_t int_any[N_INT], float_any[N_FLOAT];
    int status;
} Scan;

typedef struct { const char *p, *e; Scan *s; } Cur;

static uint64_t hash_bytes(const char *p, int64_t n, char tag) {
    uint64_t h = 1469598103934665603ULL ^ (uint8_t)tag;
    for (int64_t i = 0; i < n; i++) { h ^= (uint8_t)p[i]; h *= 1099511628211ULL; }
    return h;
}

static int intern_grow(Intern *t) {
    int64_t cap = t->cap ? t->cap * 2 : 256;
    int32_t *slots = calloc((size_t)cap, sizeof(int32_t));
    if (!slots) return -1;
    for (int64_t c = 0; c < t->n; c++) {
        int64_t i = (int64_t)(t->hash[c] & (uint64_t)(cap - 1));
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (int32_t)(c + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* Code of the key (creating it); -1 when out of memory. */
static int32_t intern_key(Scan *s, int col, const char *p, int64_t n, char tag) {
    Intern *t = &s->intern[col];
    if ((t->n + 1) * 2 > t->cap && intern_grow(t)) return -1;
    uint64_t h = hash_bytes(p, n, tag);
    int64_t i = (int64_t)(h & (uint64_t)(t->cap - 1));
    while (t->slots[i]) {
        int32_t c = t->slots[i] - 1;
        if (t->hash[c] == h && t->len[c] == n && t->tag[c] == tag &&
            memcmp(s->buf + t->off[c], p, (size_t)n) == 0)
            return c;
        i = (i + 1) & (t->cap - 1);
    }
    if (t->n == t->kcap) {
        int64_t k = t->kcap ? t->kcap * 2 : 64;
        int64_t *off = realloc(t->off, (size_t)k * sizeof(int64_t));
        if (!off) return -1;
        t->off = off;
        int64_t *len = realloc(t->len, (size_t)k * sizeof(int64_t));
        if (!len) return -1;
        t->len = len;
        char *tg = realloc(t->tag, (size_t)k);
        if (!tg) return -1;
        t->tag = tg;
        uint64_t *hs = realloc(t->hash, (size_t)k * sizeof(uint64_t));
        if (!hs) return -1;
        t->hash = hs;
        t->kcap = k;
    }
    int32_t c = (int32_t)t->n++;
    t->off[c] = p - s->buf;
    t->len[c] = n;
    t->tag[c] = tag;
    t->hash[c] = h;
    t->slots[i] = c + 1;
    return c;
}

static int add_row(Scan *s) {
    if (s->rows == s->cap) {
        /* Kineto writes 150-300 bytes per event: start near the final size. */
        int64_t cap = s->cap ? s->cap * 2 : 256 + s->size / 192;
        for (int k = 0; k < N_TEXT; k++) {
            void *p = realloc(s->text[k], (size_t)cap * sizeof(int32_t));
            if (!p) return -1;
            s->text[k] = p;
        }
        for (int k = 0; k < N_INT; k++) {
            void *p = realloc(s->ints[k], (size_t)cap * sizeof(int64_t));
            if (!p) return -1;
            s->ints[k] = p;
            p = realloc(s->ihas[k], (size_t)cap);
            if (!p) return -1;
            s->ihas[k] = p;
        }
        for (int k = 0; k < N_FLOAT; k++) {
            void *p = realloc(s->floats[k], (size_t)cap * sizeof(double));
            if (!p) return -1;
            s->floats[k] = p;
            p = realloc(s->fhas[k], (size_t)cap);
            if (!p) return -1;
            s->fhas[k] = p;
        }
        s->cap = cap;
    }
    int64_t r = s->rows++;
    for (int k = 0; k < N_TEXT; k++) s->text[k][r] = -1;
    for (int k = 0; k < N_INT; k++) s->ihas[k][r] = 0;
    for (int k = 0; k < N_FLOAT; k++) s->fhas[k][r] = 0;
    return 0;
}

static void ws(Cur *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

/* After the opening quote: the body up to the closing quote (escapes kept). */
static int string_body(Cur *c, const char **body, int64_t *n, int *escaped) {
    const char *start = c->p;
    int esc = 0;
    while (c->p < c->e) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            *body = start;
            *n = c->p - start;
            *escaped = esc;
            c->p++;
            return 0;
        }
        if (ch == '\\') {
            esc = 1;
            c->p += 2;
            continue;
        }
        if (ch < 0x20) return -1;
        c->p++;
    }
    return -1;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A JSON number; *is_int when it has no fraction or exponent. */
static int number(Cur *c, const char **start, int64_t *n, int *is_int) {
    const char *p = c->p, *e = c->e;
    *start = p;
    *is_int = 1;
    if (p < e && *p == '-') p++;
    if (p >= e || !is_digit(*p)) return -1;
    if (*p == '0') p++;
    else while (p < e && is_digit(*p)) p++;
    if (p < e && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= e || !is_digit(*p)) return -1;
        while (p < e && is_digit(*p)) p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || !is_digit(*p)) return -1;
        while (p < e && is_digit(*p)) p++;
    }
    *n = p - *start;
    c->p = p;
    return 0;
}

static int literal(Cur *c, const char *word, int n) {
    if (c->e - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return -1;
    c->p += n;
    return 0;
}

/* At '{' or '[': steps in; 1 = a member follows, 0 = empty (closed), -1 = not there. */
static int open_container(Cur *c, char open, char close) {
    if (c->p >= c->e || *c->p != open) return -1;
    c->p++;
    ws(c);
    if (c->p < c->e && *c->p == close) { c->p++; return 0; }
    return 1;
}

/* An object member's `"key" :`; *escaped tells whether the key had escapes
   (which the field tables cannot match: the caller decides). */
static int member_key(Cur *c, const char **k, int64_t *kn, int *escaped) {
    if (c->p >= c->e || *c->p != '"') return -1;
    c->p++;
    if (string_body(c, k, kn, escaped)) return -1;
    ws(c);
    if (c->p >= c->e || *c->p != ':') return -1;
    c->p++;
    ws(c);
    return 0;
}

/* After a member: 1 = another follows, 0 = the container closed, -1 = malformed. */
static int member_end(Cur *c, char close) {
    ws(c);
    if (c->p >= c->e) return -1;
    if (*c->p == ',') { c->p++; ws(c); return 1; }
    if (*c->p == close) { c->p++; return 0; }
    return -1;
}

static const Field *find_field(const Field *fields, size_t n, const char *k, int64_t kn) {
    for (size_t j = 0; j < n; j++)
        if (fields[j].klen == kn && fields[j].key[0] == k[0] &&
            memcmp(fields[j].key, k, (size_t)kn) == 0)
            return &fields[j];
    return NULL;
}

static int skip_value(Cur *c, int depth);

static int skip_container(Cur *c, char open, char close, int depth) {
    int more = open_container(c, open, close);
    while (more > 0) {
        const char *k; int64_t kn; int esc;
        if (close == '}' && member_key(c, &k, &kn, &esc)) return -1;
        if (skip_value(c, depth + 1)) return -1;
        more = member_end(c, close);
    }
    return more;
}

static int skip_value(Cur *c, int depth) {
    if (depth > 64 || c->p >= c->e) return -1;
    char ch = *c->p;
    if (ch == '{') return skip_container(c, '{', '}', depth);
    if (ch == '[') return skip_container(c, '[', ']', depth);
    if (ch == '"') {
        const char *b; int64_t n; int esc;
        c->p++;
        return string_body(c, &b, &n, &esc);
    }
    if (ch == 't') return literal(c, "true", 4);
    if (ch == 'f') return literal(c, "false", 5);
    if (ch == 'n') return literal(c, "null", 4);
    const char *s; int64_t n; int is_int;
    return number(c, &s, &n, &is_int);
}

/* Integer literal -> int64; -1 when it does not fit. */
static int parse_int(const char *p, int64_t n, int64_t *out) {
    int neg = 0;
    int64_t i = 0;
    uint64_t v = 0;
    if (p[0] == '-') { neg = 1; i = 1; }
    if (n - i > 19) return -1;
    for (; i < n; i++) {
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (!neg && v > (uint64_t)INT64_MAX) return -1;
    if (neg && v > (uint64_t)INT64_MAX + 1) return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* Clinger's fast path: when the digits fit in 2^53 and at most 22 of them
   are decimals, m / 10^k of two exact doubles is the correctly rounded value,
   the same as strtod (and msgspec) give. Kineto's timestamps all take it;
   anything else (exponents, long mantissas) goes through strtod. */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
    1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int fast_double(const char *p, int64_t n, double *out) {
    int64_t i = p[0] == '-' ? 1 : 0;
    uint64_t m = 0;
    int digits = 0, decimals = 0, dot = 0;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '.') { dot = 1; continue; }
        if (ch == 'e' || ch == 'E' || ++digits > 19) return -1;
        m = m * 10 + (uint64_t)(ch - '0');
        decimals += dot;
    }
    if (m > (1ULL << 53) || decimals > 22) return -1;
    double v = (double)m;
    if (decimals) v /= POW10[decimals];
    *out = p[0] == '-' ? -v : v;
    return 0;
}

/* Reads one field's value into row r; -1 = odd or malformed. */
static int field_value(Cur *c, const Field *f, int64_t r);

static int args_object(Cur *c, int64_t r) {
    int more = open_container(c, '{', '}');
    while (more > 0) {
        const char *k; int64_t kn; int esc;
        if (member_key(c, &k, &kn, &esc) || esc) return -1;
        const Field *f = find_field(ARG_FIELDS, N_ARG_FIELDS, k, kn);
        if (f ? field_value(c, f, r) : skip_value(c, 0)) return -1;
        more = member_end(c, '}');
    }
    return more;
}

static int field_value(Cur *c, const Field *f, int64_t r) {
    Scan *s = c->s;
    if (c->p >= c->e) return -1;
    char ch = *c->p;
    if (f->kind == K_ARGS) return args_object(c, r);
    if (f->kind == K_RAW) {
        const char *start = c->p;
        if (skip_value(c, 0)) return -1;
        int32_t code = intern_key(s, f->col, start, c->p - start, 'r');
        if (code < 0) { s->status = TL_NOMEM; return -1; }
        s->text[f->col][r] = code;
        return 0;
    }
    if (ch == 'n') {
        if (literal(c, "null", 4)) return -1;
        /* null is "absent" for every kind: a later duplicate key may still set it */
        if (f->kind == K_STR || f->kind == K_VALTXT) s->text[f->col][r] = -1;
        else if (f->kind == K_ID) { s->ihas[f->col][r] = 0; s->text[f->col2][r] = -1; }
        else if (f->kind == K_INT) s->ihas[f->col][r] = 0;
        else s->fhas[f->col][r] = 0;
        return 0;
    }
    if (ch == '"') {
        const char *b; int64_t n; int esc;
        if (f->kind != K_STR && f->kind != K_VALTXT && f->kind != K_ID) return -1;
        c->p++;
        if (string_body(c, &b, &n, &esc)) return -1;
        int col = f->kind == K_ID ? f->col2 : f->col;
        int32_t code = intern_key(s, col, b, n, 's');
        if (code < 0) { s->status = TL_NOMEM; return -1; }
        s->text[col][r] = code;
        if (f->kind == K_ID) s->ihas[f->col][r] = 0;
        return 0;
    }
    if (ch == '-' || is_digit(ch)) {
        const char *start; int64_t n; int is_int;
        if (number(c, &start, &n, &is_int)) return -1;
        if (f->kind == K_FLOAT) {
            double v;
            if (fast_double(start, n, &v)) {
                char *end;
                v = strtod(start, &end);
                if (end != start + n) return -1;  /* e.g. a locale with a decimal comma */
                if (!isfinite(v)) return -1;
            }
            s->floats[f->col][r] = v;
            s->fhas[f->col][r] = 1;
            s->float_any[f->col] = 1;
            return 0;
        }
        if (!is_int) return -1;
        if (f->kind == K_VALTXT) {
            int32_t code = intern_key(s, f->col, start, n, 'i');
            if (code < 0) { s->status = TL_NOMEM; return -1; }
            s->text[f->col][r] = code;
            return 0;
        }
        if (f->kind != K_INT && f->kind != K_ID) return -1;
        int64_t v;
        if (parse_int(start, n, &v)) return -1;
        s->ints[f->col][r] = v;
        s->ihas[f->col][r] = 1;
        s->int_any[f->col] = 1;
        if (f->kind == K_ID) s->text[f->col2][r] = -1;
        return 0;
    }
    return -1;  /* true/false/object/array where a scalar belongs */
}

static int event_object(Cur *c) {
    Scan *s = c->s;
    int more = open_container(c, '{', '}');
    if (more <= 0) return -1;  /* not an object, or {} without ph: odd */
    if (add_row(s)) { s->status = TL_NOMEM; return -1; }
    int64_t r = s->rows - 1;
    while (more > 0) {
        const char *k; int64_t kn; int esc;
        if (member_key(c, &k, &kn, &esc) || esc) return -1;
        const Field *f = find_field(EVENT_FIELDS, N_EVENT_FIELDS, k, kn);
        if (f ? field_value(c, f, r) : skip_value(c, 0)) return -1;
        more = member_end(c, '}');
    }
    if (more < 0) return -1;
    /* The phases the ingest keeps, and a numeric ts: else the Python path
       decides (and counts) what to drop. */
    int32_t ph = s->text[T_PH][r];
    if (ph < 0 || !s->fhas[F_TS][r]) return -1;
    Intern *t = &s->intern[T_PH];
    if (t->len[ph] != 1 || !strchr("XiIsftM", s->buf[t->off[ph]])) return -1;
    return 0;
}

static int events_array(Cur *c) {
    int more = open_container(c, '[', ']');
    while (more > 0) {
        if (event_object(c)) return -1;
        more = member_end(c, ']');
    }
    return more;
}

static int top_object(Cur *c) {
    Scan *s = c->s;
    int seen = 0;
    ws(c);
    int more = open_container(c, '{', '}');
    while (more > 0) {
        const char *k; int64_t kn; int esc;
        if (member_key(c, &k, &kn, &esc) || esc) return -1;
        if (kn == 11 && memcmp(k, "traceEvents", 11) == 0) {
            if (seen++) return -1;
            s->events_start = c->p - s->buf;
            if (events_array(c)) return -1;
            s->events_end = c->p - s->buf;
        } else {
            const char *v = c->p;
            if (s->n_top == MAX_TOP || skip_value(c, 0)) return -1;
            int64_t *t = s->top[s->n_top++];
            t[0] = k - s->buf;
            t[1] = kn;
            t[2] = v - s->buf;
            t[3] = c->p - v;
        }
        more = member_end(c, '}');
    }
    if (more < 0) return -1;
    ws(c);
    return (seen && c->p == c->e) ? 0 : -1;
}

void tl_free(Scan *s) {
    if (!s) return;
    for (int k = 0; k < N_TEXT; k++) {
        free(s->text[k]);
        Intern *t = &s->intern[k];
        free(t->slots); free(t->off); free(t->len); free(t->tag); free(t->hash);
    }
    for (int k = 0; k < N_INT; k++) { free(s->ints[k]); free(s->ihas[k]); }
    for (int k = 0; k < N_FLOAT; k++) { free(s->floats[k]); free(s->fhas[k]); }
    free(s);
}

/* Scans buf[0:size]; returns NULL when out of memory, else a Scan whose
   status is TL_OK (columns filled) or TL_ODD (use the Python path). */
Scan *tl_scan(const char *buf, int64_t size) {
    Scan *s = calloc(1, sizeof(Scan));
    if (!s) return NULL;
    s->buf = buf;
    s->size = size;
    Cur c = { buf, buf + size, s };
    if (top_object(&c)) {
        if (s->status == TL_NOMEM) { tl_free(s); return NULL; }
        s->status = TL_ODD;
    }
    return s;
}

int tl_status(Scan *s) { return s->status; }
int64_t tl_rows(Scan *s) { return s->rows; }
int64_t tl_events_start(Scan *s) { return s->events_start; }
int64_t tl_events_end(Scan *s) { return s->events_end; }
int tl_top_count(Scan *s) { return s->n_top; }
int64_t *tl_top(Scan *s) { return &s->top[0][0]; }
int tl_int_any(Scan *s, int k) { return s->int_any[k]; }
int tl_float_any(Scan *s, int k) { return s->float_any[k]; }
int32_t *tl_text(Scan *s, int k) { return s->text[k]; }
int64_t tl_text_count(Scan *s, int k) { return s->intern[k].n; }
int64_t *tl_text_off(Scan *s, int k) { return s->intern[k].off; }
int64_t *tl_text_len(Scan *s, int k) { return s->intern[k].len; }
char *tl_text_tag(Scan *s, int k) { return s->intern[k].tag; }
int64_t *tl_int(Scan *s, int k) { return s->ints[k]; }
uint8_t *tl_int_has(Scan *s, int k) { return s->ihas[k]; }
double *tl_float(Scan *s, int k) { return s->floats[k]; }
uint8_t *tl_float_has(Scan *s, int k) { return s->fhas[k]; }

/* Append s to out (only if it fits whole); returns the length so far. */
static int64_t put(char *out, int64_t cap, int64_t n, const char *s) {
    int64_t len = (int64_t)strlen(s);
    if (n + len < cap) memcpy(out + n, s, (size_t)len);
    return n + len;
}

static int64_t put_columns(char *out, int64_t cap, int64_t n, const char *kind,
                           const char *const *names, int count) {
    n = put(out, cap, n, kind);
    for (int k = 0; k < count; k++) {
        n = put(out, cap, n, "\t");
        n = put(out, cap, n, names[k]);
    }
    return put(out, cap, n, "\n");
}

static int64_t put_fields(char *out, int64_t cap, int64_t n, const char *where,
                          const Field *fields, size_t count) {
    for (size_t k = 0; k < count; k++) {
        const Field *f = &fields[k];
        n = put(out, cap, n, where);
        n = put(out, cap, n, "\t");
        n = put(out, cap, n, f->key);
        switch (f->kind) {
        case K_ID:
            n = put(out, cap, n, "\tint:");
            n = put(out, cap, n, INT_NAMES[f->col]);
            n = put(out, cap, n, "\ttext:");
            n = put(out, cap, n, TEXT_NAMES[f->col2]);
            break;
        case K_INT:
            n = put(out, cap, n, "\tint:");
            n = put(out, cap, n, INT_NAMES[f->col]);
            break;
        case K_FLOAT:
            n = put(out, cap, n, "\tfloat:");
            n = put(out, cap, n, FLOAT_NAMES[f->col]);
            break;
        case K_ARGS:
            n = put(out, cap, n, "\targs");
            break;
        default: /* K_STR, K_VALTXT, K_RAW */
            n = put(out, cap, n, "\ttext:");
            n = put(out, cap, n, TEXT_NAMES[f->col]);
        }
        n = put(out, cap, n, "\n");
    }
    return n;
}

/*
 * The layout this library was built with, one tab-separated line per item:
 * "abi", the text/int/float column names in array order, then each event and
 * args key with the columns it fills. Writes it NUL-ended into out when cap
 * is large enough; returns its length either way (call again with more room).
 */
int64_t tl_layout(char *out, int64_t cap) {
    int64_t n = put(out, cap, 0, "abi\t" TL_ABI "\n");
    n = put_columns(out, cap, n, "text", TEXT_NAMES, N_TEXT);
    n = put_columns(out, cap, n, "int", INT_NAMES, N_INT);
    n = put_columns(out, cap, n, "float", FLOAT_NAMES, N_FLOAT);
    n = put_fields(out, cap, n, "event", EVENT_FIELDS, N_EVENT_FIELDS);
    n = put_fields(out, cap, n, "arg", ARG_FIELDS, N_ARG_FIELDS);
    if (cap > 0) out[n < cap ? n : cap - 1] = '\0';
    return n;
}
