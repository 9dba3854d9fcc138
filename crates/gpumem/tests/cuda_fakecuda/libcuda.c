// A fake CUDA driver for tests/cuda_fakecuda.rs: the driver-API calls gpumem's CUDA backend
// makes, with device memory in host memory (cuMemAlloc = posix_memalign, cuMemsetD32 and
// cuMemcpyDtoH touch real bytes) and VMM on mmap (reserve = PROT_NONE range, map + set
// access = read-write pages). One device of 16 GiB, 2 MiB granularity, 512 B texture
// alignment. It checks the VMM rules the real driver enforces (map only inside a
// reservation and not twice, access only on mapped pages, unmap whole mappings, free only
// whole reservations) and that the primary context is never released more than retained.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <pthread.h>
#include <sys/mman.h>
typedef int CUresult; typedef int CUdevice; typedef unsigned long long CUdeviceptr;
typedef void* CUcontext; typedef void* CUstream; typedef void* CUevent; typedef void* CUmemoryPool;
#define OK 0
#define OOM 2
#define INVALID 1
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const unsigned long long CAP = 16ULL << 30, G = 2ULL << 20;
static unsigned long long used = 0;
struct rec { CUdeviceptr a; size_t n; int kind; int live; }; // kind 0 seg, 1 managed, 2 map, 3 reserve
static struct rec recs[1 << 16]; static int nrec = 0; /* live records only grow nrec when no dead slot is free */
static struct { size_t n; int live; } hs[1 << 16]; static int nh = 0;
static void add(CUdeviceptr a, size_t n, int k) { for (int i=0;i<nrec;i++) if(!recs[i].live){recs[i]=(struct rec){a,n,k,1};return;} if (nrec == (1 << 16)) { fprintf(stderr, "FAKE: too many records\n"); abort(); } recs[nrec++] = (struct rec){a,n,k,1}; }
static struct rec* find(CUdeviceptr a, int k) { for (int i=0;i<nrec;i++) if(recs[i].live && recs[i].kind==k && a>=recs[i].a && a<recs[i].a+recs[i].n) return &recs[i]; return 0; }
CUresult cuInit(unsigned f){return OK;}
CUresult cuDriverGetVersion(int*v){*v=13000;return OK;}
CUresult cuDeviceGetCount(int*c){*c=1;return OK;}
CUresult cuDeviceGet(CUdevice*d,int o){if(o!=0)return 101;*d=0;return OK;}
CUresult cuDeviceGetName(char*n,int len,CUdevice d){strncpy(n,"Fake H200",len);return OK;}
CUresult cuDeviceTotalMem_v2(size_t*b,CUdevice d){*b=CAP;return OK;}
CUresult cuDeviceGetAttribute(int*v,int a,CUdevice d){*v= a==14?512: a==51?32: (a==102||a==115||a==83||a==89)?1:0; return OK;}
CUresult cuDeviceCanAccessPeer(int*v,CUdevice a,CUdevice b){*v=0;return OK;}
static int ctxdummy; static int refs=0;
CUresult cuDevicePrimaryCtxRetain(CUcontext*c,CUdevice d){pthread_mutex_lock(&mu);refs++;pthread_mutex_unlock(&mu);*c=&ctxdummy;return OK;}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d){pthread_mutex_lock(&mu);refs--;if(refs<0){fprintf(stderr,"FAKE: ctx released too often\n");abort();}pthread_mutex_unlock(&mu);return OK;}
CUresult cuCtxSetCurrent(CUcontext c){return c==&ctxdummy?OK:201;}
CUresult cuCtxSynchronize(void){return OK;}
CUresult cuMemGetInfo_v2(size_t*f,size_t*t){*f=CAP-used;*t=CAP;return OK;}
static CUresult alloc(CUdeviceptr*p,size_t n,int k){pthread_mutex_lock(&mu);if(used+n>CAP){pthread_mutex_unlock(&mu);return OOM;}void*m=0;if(posix_memalign(&m,512,n?n:1)){pthread_mutex_unlock(&mu);return OOM;}used+=n;*p=(CUdeviceptr)m;add(*p,n,k);pthread_mutex_unlock(&mu);return OK;}
CUresult cuMemAlloc_v2(CUdeviceptr*p,size_t n){return alloc(p,n,0);}
CUresult cuMemAllocManaged(CUdeviceptr*p,size_t n,unsigned f){return alloc(p,n,1);}
CUresult cuMemFree_v2(CUdeviceptr p){pthread_mutex_lock(&mu);for(int i=0;i<nrec;i++)if(recs[i].live&&recs[i].a==p&&recs[i].kind<2){recs[i].live=0;used-=recs[i].n;free((void*)p);pthread_mutex_unlock(&mu);return OK;}pthread_mutex_unlock(&mu);fprintf(stderr,"FAKE: bad cuMemFree %llx\n",p);return INVALID;}
CUresult cuMemAllocPitch_v2(CUdeviceptr*p,size_t*pitch,size_t w,size_t h,unsigned e){*pitch=(w+511)&~511ULL;return alloc(p,*pitch*h,0);}
typedef struct {int type; int id;} Loc;
CUresult cuMemPrefetchAsync_v2(CUdeviceptr p,size_t n,Loc l,unsigned f,CUstream s){return find(p,1)?OK:INVALID;}
CUresult cuMemAdvise_v2(CUdeviceptr p,size_t n,int a,Loc l){return find(p,1)?OK:INVALID;}
CUresult cuMemGetAllocationGranularity(size_t*g,const void*prop,int o){*g=G;return OK;}
CUresult cuMemAddressReserve(CUdeviceptr*p,size_t n,size_t al,CUdeviceptr a,unsigned long long f){if(n%G)return INVALID;void*m=mmap(0,n+G,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);if(m==MAP_FAILED)return OOM;CUdeviceptr b=((CUdeviceptr)m+G-1)&~(G-1);pthread_mutex_lock(&mu);add(b,n,3);pthread_mutex_unlock(&mu);*p=b;return OK;}
CUresult cuMemAddressFree(CUdeviceptr p,size_t n){pthread_mutex_lock(&mu);struct rec*r=find(p,3);if(!r||r->a!=p||r->n!=n){pthread_mutex_unlock(&mu);fprintf(stderr,"FAKE: bad AddressFree p=%llx n=%zu r=%p (%llx %zu)\n",p,n,(void*)r,r?r->a:0,r?r->n:0);return INVALID;}r->live=0;pthread_mutex_unlock(&mu);munmap((void*)p,n);return OK;}
CUresult cuMemCreate(unsigned long long*h,size_t n,const void*prop,unsigned long long f){if(n%G)return INVALID;pthread_mutex_lock(&mu);if(used+n>CAP){pthread_mutex_unlock(&mu);return OOM;}int i=0;while(i<nh&&hs[i].live)i++;if(i==nh){if(nh==(1<<16)){pthread_mutex_unlock(&mu);return OOM;}nh++;}used+=n;hs[i].n=n;hs[i].live=1;*h=i+1;pthread_mutex_unlock(&mu);return OK;}
CUresult cuMemRelease(unsigned long long h){pthread_mutex_lock(&mu);if(h<1||h>(unsigned long long)nh||!hs[h-1].live){pthread_mutex_unlock(&mu);fprintf(stderr,"FAKE: bad release\n");return INVALID;}hs[h-1].live=0;used-=hs[h-1].n;pthread_mutex_unlock(&mu);return OK;}
CUresult cuMemMap(CUdeviceptr p,size_t n,size_t off,unsigned long long h,unsigned long long f){pthread_mutex_lock(&mu);if(!find(p,3)||find(p,2)){pthread_mutex_unlock(&mu);fprintf(stderr,"FAKE: bad map p=%llx n=%zu res=%p map=%p (a=%llx n=%zu)\n",p,n,(void*)find(p,3),(void*)find(p,2),find(p,2)?find(p,2)->a:0,find(p,2)?find(p,2)->n:0);return INVALID;}add(p,n,2);pthread_mutex_unlock(&mu);mmap((void*)p,n,PROT_NONE,MAP_FIXED|MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);return OK;}
CUresult cuMemSetAccess(CUdeviceptr p,size_t n,const void*d,size_t c){for(CUdeviceptr a=p;a<p+n;a+=G)if(!find(a,2)){fprintf(stderr,"FAKE: access on unmapped\n");return INVALID;}mprotect((void*)p,n,PROT_READ|PROT_WRITE);return OK;}
CUresult cuMemUnmap(CUdeviceptr p,size_t n){pthread_mutex_lock(&mu);for(CUdeviceptr a=p;a<p+n;){struct rec*r=find(a,2);if(!r){pthread_mutex_unlock(&mu);fprintf(stderr,"FAKE: bad unmap\n");return INVALID;}r->live=0;a=r->a+r->n;}pthread_mutex_unlock(&mu);mmap((void*)p,n,PROT_NONE,MAP_FIXED|MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);return OK;}
CUresult cuMemsetD32_v2(CUdeviceptr p,unsigned v,size_t n){unsigned*q=(unsigned*)p;for(size_t i=0;i<n;i++)q[i]=v;return OK;}
CUresult cuMemcpyDtoH_v2(void*d,CUdeviceptr s,size_t n){memcpy(d,(void*)s,n);return OK;}
CUresult cuPointerGetAttribute(void*out,int attr,CUdeviceptr p){pthread_mutex_lock(&mu);struct rec*r=find(p,0);if(!r)r=find(p,1);if(!r)r=find(p,2);pthread_mutex_unlock(&mu);if(!r)return INVALID;
 switch(attr){case 9:*(int*)out=0;break;case 2:*(unsigned*)out=r->kind==1?2:2;break;case 11:*(CUdeviceptr*)out=r->a;break;case 12:*(size_t*)out=r->n;break;case 13:*(int*)out=1;break;case 8:*(int*)out=r->kind==1;break;default:return INVALID;}return OK;}
static int dummy;
CUresult cuStreamCreate(CUstream*s,unsigned f){*s=malloc(8);return OK;}
CUresult cuStreamDestroy_v2(CUstream s){free(s);return OK;}
CUresult cuStreamSynchronize(CUstream s){return OK;}
CUresult cuEventCreate(CUevent*e,unsigned f){*e=malloc(8);return OK;}
CUresult cuEventRecord(CUevent e,CUstream s){return OK;}
CUresult cuEventQuery(CUevent e){return OK;}
CUresult cuEventSynchronize(CUevent e){return OK;}
CUresult cuEventDestroy_v2(CUevent e){free(e);return OK;}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool*p,CUdevice d){*p=&dummy;return OK;}
CUresult cuMemPoolSetAttribute(CUmemoryPool p,int a,void*v){return OK;}
CUresult cuMemPoolTrimTo(CUmemoryPool p,size_t n){return OK;}
CUresult cuMemAllocAsync(CUdeviceptr*p,size_t n,CUstream s){return alloc(p,n,0);}
CUresult cuMemFreeAsync(CUdeviceptr p,CUstream s){return cuMemFree_v2(p);}
CUresult cuGetErrorName(CUresult e,const char**s){*s="CUDA_ERROR_FAKE";return OK;}
