"""Rewrites `Store` arguments where a narrow handle is expected, from the
compiler's E0308 errors: `store.clone()` -> `store.sessions()`, `&store` ->
`&store.sessions()`; RunnerTables/DeliveryTables/AgentTables go through
`wiring::tables`. Usage: fix_types.py cargo build --all-targets --message-format=json"""
import json,re,sys,subprocess,collections
getter={'Sessions':'sessions','Transcripts':'transcripts','Inbox':'inbox','Outbox':'outbox','Processes':'processes','Buttons':'buttons','Approvals':'approvals','Jobs':'jobs','AgentSessions':'agent_sessions','Generations':'generations','ChildGroups':'child_groups','FileSends':'file_sends','Users':'users','Usage':'usage','StoreHealth':'health'}
tables={'RunnerTables':'runner','DeliveryTables':'delivery','AgentTables':'agent','TransportTables':'transport'}
out=subprocess.run(sys.argv[1:],capture_output=True,text=True).stdout
edits=collections.defaultdict(dict)
for l in out.splitlines():
    try: j=json.loads(l)
    except: continue
    if j.get('reason')!='compiler-message': continue
    msg=j['message']
    if not msg.get('code') or msg['code']['code']!='E0308': continue
    for sp in msg['spans']:
        if not sp['is_primary'] or not sp.get('label'): continue
        m=re.match(r'expected `(&?)(?:[\w:]*::)?(\w+)`, found `&?(?:[\w:]*::)?Store`',sp['label'])
        if not m: continue
        ty=m.group(2); f=sp['file_name']
        edits[f][(sp['byte_start'],sp['byte_end'])]=ty
n=0
for f,es in edits.items():
    b=open(f,'rb').read()
    crate='crate' if f.startswith('src/') else 'telegate'
    for (s,e),ty in sorted(es.items(),reverse=True):
        expr=b[s:e].decode()
        amp=expr.startswith('&')
        core=expr[1:] if amp else expr
        if core.endswith('.clone()'): core=core[:-len('.clone()')]
        if ty in getter: new=('&' if amp else '')+core+'.'+getter[ty]+'()'
        elif ty in tables: new=('&' if amp else '')+f'{crate}::wiring::tables::{tables[ty]}(&{core})'
        else: continue
        b=b[:s]+new.encode()+b[e:]; n+=1
    open(f,'wb').write(b)
print('edits',n)
