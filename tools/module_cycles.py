#!/usr/bin/env python3
"""Finds import cycles between the modules of a Rust crate's src/ (one
module per file; a parent and its children are one family, not a cycle).
An edge is a path the file names: `crate::a::b`, `super::x`, or `b::c`
after `use crate::b` / `use crate::b::{self, ..}`; comments and `#[cfg(test)]`
modules are left out. Prints every cycle and exits 1 if there is one.
Run by `make test` (tests/api/ops.rs) on crates/oncepay/src."""
import os, re, sys
root=sys.argv[1]
mods={}
for dp,dn,fn in os.walk(root):
    for f in fn:
        if not f.endswith('.rs'): continue
        p=os.path.join(dp,f); rel=os.path.relpath(p,root)[:-3]
        parts=rel.split(os.sep)
        if parts[-1] in ('mod','lib','main'): parts=parts[:-1]
        mods['::'.join(parts)]=open(p).read()
names=set(mods)
def resolve(path):
    segs=path.split('::')
    for k in range(len(segs),0,-1):
        m='::'.join(segs[:k])
        if m in names: return m
    return None
edges={m:set() for m in mods}
for m,text in mods.items():
    # strip comments
    text=re.sub(r'//[^\n]*','',text)
    # cut test modules
    i=text.find('#[cfg(test)]')
    if i>=0: text=text[:i]
    for mm in re.finditer(r'crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)',text):
        t=resolve(mm.group(1))
        if t and t!=m and not m.startswith(t+'::') and not t.startswith(m+'::'): edges[m].add(t)
    # use crate::{a, b::c}
    for mm in re.finditer(r'use crate::\{([^}]*)\}',text):
        for item in mm.group(1).split(','):
            item=item.strip().split(' ')[0]
            t=resolve(item.replace('self',''))
            if t and t!=m and not m.startswith(t+'::') and not t.startswith(m+'::'): edges[m].add(t)
    tops={n.split('::')[0] for n in names}
    imported=set()
    for mm in re.finditer(r'use crate::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*)\s*;)',text):
        if mm.group(2): imported.add(mm.group(2))
        else:
            for item in mm.group(1).split(','):
                item=item.strip()
                if '::' not in item and item in tops: imported.add(item)
    for mm in re.finditer(r'use crate::([a-z_][a-z0-9_]*)::\{[^}]*\bself\b',text):
        imported.add(mm.group(1))
    for mm in re.finditer(r'(?<![:\w])([a-z_][a-z0-9_]*)::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)',text):
        if mm.group(1) in imported:
            t=resolve(mm.group(1)+'::'+mm.group(2))
            if t and t!=m and not m.startswith(t+'::') and not t.startswith(m+'::'): edges[m].add(t)
    base=m.split('::')
    for mm in re.finditer(r'\bsuper::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)',text):
        parent=base[:-1]
        t=resolve('::'.join(parent+[mm.group(1)]))
        if t and t!=m and not m.startswith(t+'::') and not t.startswith(m+'::'): edges[m].add(t)
# find SCCs (Tarjan)
index={};low={};st=[];on=set();sccs=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    index[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges[v]:
        if w not in index: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: sccs.append(comp)
for v in edges:
    if v not in index: sc(v)
for s in sccs:
    print('import cycle between modules:', ' <-> '.join(sorted(s)))
    for v in sorted(s):
        print('   ', v, '->', ', '.join(sorted(w for w in edges[v] if w in s)))
sys.exit(1 if sccs else 0)
